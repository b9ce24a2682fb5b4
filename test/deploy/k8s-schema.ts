import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { pathToFileURL } from "node:url";

/**
 * Kubernetes API schema validation for the manifests, with the JSON schemas
 * of kubernetes-models (the OpenAPI definitions of the Kubernetes API,
 * compiled to validators). Those schemas allow unknown fields, as the API
 * server's non-strict decoding does, so a misspelt field (readinesProbe)
 * would pass; the API server drops it silently. So each object is validated
 * through a proxy that records which properties the validator reads: a key
 * the schema never looks at (and no map-typed field enumerated) is a field
 * the API does not know, and is reported.
 */

type Validate = ((data: unknown) => boolean) & {
  errors?: { instancePath: string; message?: string; keyword: string; params: unknown }[] | null;
};

/** The schema module of a kind: IoK8sApi<Group><Version><Kind> (the core group is "Core"). */
function schemaModule(apiVersion: string, kind: string): string {
  const [group, version] = apiVersion.includes("/") ? apiVersion.split("/") : ["core", apiVersion];
  const pascal = (s: string) => s.charAt(0).toUpperCase() + s.slice(1);
  const g = pascal(group!.split(".")[0]!);
  // The package exports its models, not its schema files: they are loaded by path.
  const pkg = dirname(createRequire(import.meta.url).resolve("kubernetes-models/package.json"));
  return pathToFileURL(join(pkg, "_schemas", `IoK8sApi${g}${pascal(version!)}${kind}.js`)).href;
}

function watched(value: unknown, path: string, checks: (() => string[])[]): unknown {
  if (value === null || typeof value !== "object") return value;
  if (Array.isArray(value)) return value.map((v, i) => watched(v, `${path}/${i}`, checks));
  const obj = value as Record<string, unknown>;
  const read = new Set<string>();
  let enumerated = false;
  const copy = Object.fromEntries(
    Object.entries(obj).map(([k, v]) => [k, watched(v, `${path}/${k}`, checks)]),
  );
  checks.push(() =>
    enumerated
      ? []
      : Object.keys(obj)
          .filter((k) => !read.has(k))
          .map((k) => `${path}/${k}`),
  );
  return new Proxy(copy, {
    get(t, k) {
      if (typeof k === "string") read.add(k);
      return Reflect.get(t, k);
    },
    has(t, k) {
      if (typeof k === "string") read.add(k);
      return Reflect.has(t, k);
    },
    ownKeys(t) {
      enumerated = true;
      return Reflect.ownKeys(t);
    },
  });
}

/** Schema errors and unknown fields of one manifest object; [] when the API would take it as written. */
export async function validateManifest(doc: { apiVersion: string; kind: string }): Promise<string[]> {
  const mod = (await import(schemaModule(doc.apiVersion, doc.kind))) as { validate: Validate };
  const checks: (() => string[])[] = [];
  const ok = mod.validate(watched(doc, "", checks));
  const problems = ok
    ? []
    : (mod.validate.errors ?? []).map(
        (e) => `${e.instancePath || "/"}: ${e.message ?? e.keyword} ${JSON.stringify(e.params)}`,
      );
  for (const field of checks.flatMap((c) => c()))
    problems.push(`${field}: not a field of the Kubernetes API`);
  return problems;
}
