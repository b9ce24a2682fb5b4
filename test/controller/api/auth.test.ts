import { describe, expect, it } from "vitest";
import { Authenticator } from "../../../controller/api/auth.ts";
import { ApiError } from "../../../controller/api/errors.ts";

/** Who may call what: API tenants, admins, the scrape token, and the no-token single-user mode. */

const bearer = (t: string) => ({ authorization: `Bearer ${t}` });
function status(f: () => unknown): number {
  try {
    f();
    return 200;
  } catch (err) {
    expect(err).toBeInstanceOf(ApiError);
    return (err as ApiError).status;
  }
}

describe("Authenticator", () => {
  it("without API tokens: one user, an admin; operator endpoints open unless a scrape token is set", () => {
    const open = new Authenticator({ tokens: {}, adminTenants: [], metricsToken: "" });
    expect(open.tenant({})).toEqual({ tenant: "default", admin: true });
    expect(status(() => open.operator({}))).toBe(200);
    const scraped = new Authenticator({ tokens: {}, adminTenants: [], metricsToken: "s3cret" });
    expect(status(() => scraped.operator({}))).toBe(401);
    expect(status(() => scraped.operator(bearer("wrong")))).toBe(401);
    expect(status(() => scraped.operator(bearer("s3cret")))).toBe(200);
  });

  it("with API tokens: tenants by token, admins by tenant, the scrape token for operator endpoints only", () => {
    const a = new Authenticator({
      tokens: { ta: "tenant-a", tops: "ops" },
      adminTenants: ["ops"],
      metricsToken: "",
    });
    expect(a.tenant(bearer("ta"))).toEqual({ tenant: "tenant-a", admin: false });
    expect(a.tenant(bearer("tops"))).toEqual({ tenant: "ops", admin: true });
    expect(status(() => a.tenant({}))).toBe(401);
    expect(status(() => a.tenant(bearer("nope")))).toBe(401);
    expect(status(() => a.operator({}))).toBe(401);
    expect(status(() => a.operator(bearer("ta")))).toBe(403);
    expect(status(() => a.operator(bearer("tops")))).toBe(200);
    const s = new Authenticator({ tokens: { ta: "tenant-a" }, adminTenants: [], metricsToken: "scrape" });
    expect(status(() => s.operator(bearer("scrape")))).toBe(200);
    expect(status(() => s.tenant(bearer("scrape")))).toBe(401);
  });
});
