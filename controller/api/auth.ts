import { timingSafeEqual } from "node:crypto";
import type { IncomingHttpHeaders } from "node:http";
import { TenantId } from "../../schema/ids.ts";
import { ApiError } from "./errors.ts";

/**
 * Who is calling. API tokens (`auth.tokens`: token → tenant) admit tenants;
 * tenants listed in `auth.adminTenants` are admins (they read the whole
 * catalog and the operator endpoints). Operator endpoints (/metrics,
 * /workers) take the scrape token (`auth.metricsToken`) or an admin's token.
 *
 * With no API tokens configured there is no authentication: every caller is
 * the tenant "default" and an admin (a local single-user server); a scrape
 * token, when set, is still required for the operator endpoints.
 */
export interface AuthPolicy {
  readonly tokens: Readonly<Record<string, string>>;
  readonly adminTenants: readonly string[];
  /** Empty: the operator endpoints take an admin's token (open when there are no API tokens). */
  readonly metricsToken: string;
}

export interface Principal {
  readonly tenant: TenantId;
  readonly admin: boolean;
}

const unauthorized = (message: string) =>
  new ApiError(401, message, "authentication_error", null, "invalid_api_key");

function bearer(headers: IncomingHttpHeaders): string | undefined {
  const m = /^Bearer\s+(.+)$/i.exec(headers.authorization ?? "");
  return m ? m[1]!.trim() : undefined;
}

function sameSecret(a: string, b: string): boolean {
  const x = Buffer.from(a);
  const y = Buffer.from(b);
  return x.length === y.length && timingSafeEqual(x, y);
}

export class Authenticator {
  private readonly tokens: ReadonlyMap<string, string>;
  private readonly admins: ReadonlySet<string>;

  constructor(private readonly policy: AuthPolicy) {
    this.tokens = new Map(Object.entries(policy.tokens));
    this.admins = new Set(policy.adminTenants);
  }

  private get open(): boolean {
    return this.tokens.size === 0;
  }

  /** The calling tenant; 401 without a valid API token (when tokens are configured). */
  tenant(headers: IncomingHttpHeaders): Principal {
    if (this.open) return { tenant: TenantId("default"), admin: true };
    const token = bearer(headers);
    const tenant = token === undefined ? undefined : this.tokens.get(token);
    if (tenant === undefined) throw unauthorized("missing or invalid bearer token");
    return { tenant: TenantId(tenant), admin: this.admins.has(tenant) };
  }

  /** Admits an operator endpoint's caller: the scrape token or an admin's token. */
  operator(headers: IncomingHttpHeaders): void {
    const token = bearer(headers);
    const scrape = this.policy.metricsToken;
    if (scrape !== "" && token !== undefined && sameSecret(token, scrape)) return;
    if (this.open) {
      if (scrape === "") return;
      throw unauthorized("this endpoint needs the scrape token (auth.metricsToken)");
    }
    const tenant = token === undefined ? undefined : this.tokens.get(token);
    if (tenant === undefined)
      throw unauthorized(
        "this endpoint needs the scrape token (auth.metricsToken) or an admin tenant's token",
      );
    if (!this.admins.has(tenant))
      throw new ApiError(
        403,
        `tenant ${tenant} is not an admin (auth.adminTenants); this endpoint needs the scrape token or an admin's token`,
        "permission_error",
        null,
        "forbidden",
      );
  }
}
