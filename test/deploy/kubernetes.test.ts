import { existsSync, readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { parseAllDocuments } from "yaml";
import { type ConfigError, resolveConfig } from "../../schema/config-load.ts";
import { validateManifest } from "./k8s-schema.ts";

/**
 * deploy/kubernetes/: every object is valid against the Kubernetes API
 * schemas (kubernetes-models) with no field the API does not know, and the
 * objects fit together the way a cluster would need them to: the fleet
 * config every role reads resolves with our own validator under each
 * container's environment, services select pods and name their ports,
 * references to the ConfigMap and Secret resolve, each role runs a real
 * `continuum` command, the workers' probes and volume are where the config
 * says. The image definition copies what the command needs.
 */

const ROOT = new URL("../../", import.meta.url).pathname;
const DIR = join(ROOT, "deploy", "kubernetes");

// biome-ignore lint/suspicious/noExplicitAny: manifests are free-form YAML, checked field by field below
type Obj = any;

const docs: Obj[] = readdirSync(DIR)
  .filter((f) => f.endsWith(".yaml"))
  .sort()
  .flatMap((f) =>
    parseAllDocuments(readFileSync(join(DIR, f), "utf8")).map((d) => {
      if (d.errors.length > 0) throw new Error(`${f}: ${d.errors[0]!.message}`);
      return { ...d.toJS(), __file: f };
    }),
  );

const byKind = (kind: string) => docs.filter((d) => d.kind === kind);
const one = (kind: string, name: string): Obj => {
  const d = docs.find((x) => x.kind === kind && x.metadata.name === name);
  if (!d) throw new Error(`no ${kind} ${name} in deploy/kubernetes`);
  return d;
};
const workloads = () => docs.filter((d) => d.kind === "Deployment" || d.kind === "StatefulSet");
const containerOf = (w: Obj): Obj => w.spec.template.spec.containers[0];

/** A container's environment as the process would see it; values from the Secret or the downward API are stand-ins. */
function containerEnv(c: Obj): Record<string, string> {
  const env: Record<string, string> = {};
  for (const e of c.env ?? []) {
    if (e.value !== undefined) env[e.name] = e.value;
    else if (e.valueFrom?.secretKeyRef?.key === "api-tokens") env[e.name] = '{"t": "tenant"}';
    else if (e.valueFrom?.fieldRef?.fieldPath === "status.podIP") env[e.name] = "10.0.0.7";
    else env[e.name] = "from-the-cluster";
  }
  return env;
}

function fleetConfigFile(): unknown {
  const cm = one("ConfigMap", "continuum-fleet");
  return parseAllDocuments(cm.data["fleet.yaml"])[0]!.toJS();
}

describe("the Kubernetes manifests", () => {
  it("are valid Kubernetes API objects with no unknown field", async () => {
    expect(docs.length).toBeGreaterThanOrEqual(9);
    const problems: string[] = [];
    for (const d of docs) {
      const { __file, ...obj } = d;
      for (const p of await validateManifest(obj))
        problems.push(`${__file} ${d.kind}/${d.metadata?.name}${p}`);
    }
    expect(problems).toEqual([]);
  });

  it("the unknown-field check catches a misspelt field and a schema error", async () => {
    const worker = structuredClone(one("StatefulSet", "continuum-worker"));
    delete worker.__file;
    const c = containerOf(worker);
    c.readinesProbe = c.readinessProbe;
    c.ports[0].containerPort = "8090";
    const problems = await validateManifest(worker);
    expect(
      problems.some((p) => p.includes("/spec/template/spec/containers/0/readinesProbe: not a field")),
    ).toBe(true);
    expect(problems.some((p) => p.includes("containerPort") && p.includes("integer"))).toBe(true);
  });

  it("put every object in the continuum namespace, labelled as part of continuum", () => {
    for (const d of docs) {
      if (d.kind !== "Namespace")
        expect(d.metadata.namespace, `${d.kind}/${d.metadata.name}`).toBe("continuum");
      expect(d.metadata.labels?.["app.kubernetes.io/part-of"], `${d.kind}/${d.metadata.name}`).toBe(
        "continuum",
      );
    }
  });

  it("run two writers, one controller and a worker StatefulSet, each a real continuum role on the mounted fleet config", () => {
    expect(one("Deployment", "continuum-writer").spec.replicas).toBe(2);
    const controller = one("Deployment", "continuum-controller");
    expect(controller.spec.replicas).toBe(1);
    expect(controller.spec.strategy.type).toBe("Recreate");
    expect(one("StatefulSet", "continuum-worker").spec.replicas).toBeGreaterThanOrEqual(2);
    const roles = new Set(["writer", "controller", "worker"]);
    for (const w of workloads()) {
      const c = containerOf(w);
      expect(roles.has(c.args[0]), `${w.metadata.name}: ${c.args}`).toBe(true);
      expect(c.args.slice(1, 2)).toEqual(["--config"]);
      const mount = c.volumeMounts.find((m: Obj) => c.args[2].startsWith(`${m.mountPath}/`));
      expect(mount, `${w.metadata.name}: the config path is on a mount`).toBeDefined();
      const vol = w.spec.template.spec.volumes.find((v: Obj) => v.name === mount.name);
      expect(vol.configMap.name).toBe("continuum-fleet");
      expect(Object.keys(one("ConfigMap", "continuum-fleet").data)).toContain(
        c.args[2].slice(mount.mountPath.length + 1),
      );
      // The selector selects the pod template.
      for (const [k, v] of Object.entries(w.spec.selector.matchLabels))
        expect(w.spec.template.metadata.labels[k], `${w.metadata.name} selector ${k}`).toBe(v);
    }
  });

  it("give every role a configuration our own validator accepts, on Kafka and S3", () => {
    const file = fleetConfigFile();
    for (const w of workloads()) {
      const c = containerOf(w);
      let config: ReturnType<typeof resolveConfig>;
      try {
        config = resolveConfig(file, containerEnv(c));
      } catch (err) {
        throw new Error(`${w.metadata.name}: ${(err as ConfigError).message}`);
      }
      expect(config.catalog.log).toBe("kafka");
      expect(config.store.s3.enabled).toBe(true);
      if (c.args[0] === "controller") {
        expect(config.controller.host).toBe("0.0.0.0");
        const ports = Object.fromEntries(c.ports.map((p: Obj) => [p.name, p.containerPort]));
        expect(ports).toEqual({ http: config.controller.httpPort, workers: config.controller.workerPort });
        expect(config.auth.tokens).toEqual({ t: "tenant" });
      }
      if (c.args[0] === "worker") {
        expect(config.worker.peerHost).toBe("10.0.0.7");
        expect(config.worker.index).toBe(0);
        expect(c.ports[0].containerPort).toBe(config.worker.peerPortBase + config.worker.index);
        const url = new URL(config.worker.controllerUrl);
        const svc = one("Service", url.hostname);
        expect(
          svc.spec.ports.some((p: Obj) => p.port === Number(url.port) && p.targetPort === "workers"),
        ).toBe(true);
        // The SSD tier's files live under store.dataDir: a volume from the claim template is mounted there.
        const claim = w.spec.volumeClaimTemplates[0].metadata.name;
        expect(c.volumeMounts.find((m: Obj) => m.name === claim).mountPath).toBe(config.store.dataDir);
        expect(c.readinessProbe.httpGet).toEqual({ path: "/ready", port: "peer" });
      }
      if (c.args[0] !== "writer") expect(config.auth.clusterSecret).toBe("from-the-cluster");
    }
  });

  it("resolve every Secret and ConfigMap reference, and every Service selects pods by a named port", () => {
    const secret = one("Secret", "continuum-cluster");
    for (const w of workloads())
      for (const e of containerOf(w).env ?? []) {
        const ref = e.valueFrom?.secretKeyRef;
        if (ref) {
          expect(ref.name).toBe(secret.metadata.name);
          expect(Object.keys(secret.stringData), `${w.metadata.name} ${e.name}`).toContain(ref.key);
        }
      }
    for (const svc of byKind("Service")) {
      const target = workloads().find((w) =>
        Object.entries(svc.spec.selector).every(([k, v]) => w.spec.template.metadata.labels[k] === v),
      );
      expect(target, `Service ${svc.metadata.name} selects no pods`).toBeDefined();
      const names = containerOf(target).ports.map((p: Obj) => p.name);
      for (const p of svc.spec.ports) expect(names, `Service ${svc.metadata.name}`).toContain(p.targetPort);
    }
    const worker = one("StatefulSet", "continuum-worker");
    expect(one("Service", worker.spec.serviceName).spec.clusterIP).toBe("None");
  });

  it("have an image definition that copies what the command loads and runs bin/continuum.mjs", () => {
    const dockerfile = readFileSync(join(ROOT, "deploy", "Dockerfile"), "utf8");
    const copied = [...dockerfile.matchAll(/^COPY (?!--from)(.+) \S+$/gm)].flatMap((m) => m[1]!.split(/\s+/));
    for (const src of copied) expect(existsSync(join(ROOT, src)), `COPY ${src}`).toBe(true);
    // Every source folder the command imports from is in the image.
    for (const room of ["bin", "schema", "catalog", "controller", "worker", "cli", "native", "deploy"])
      expect(copied).toContain(room);
    expect(dockerfile).toMatch(
      /^ENTRYPOINT \["node", "--initial-old-space-size=256", "bin\/continuum\.mjs"\]$/m,
    );
    expect(dockerfile).toMatch(/^USER node$/m);
    for (const w of workloads()) expect(w.spec.template.spec.securityContext.runAsUser).toBe(1000);
  });
});
