import { describe, expect, it } from "vitest";
import { defaultConfig } from "../../schema/config.ts";
import { ConfigError, configEnvName, resolveConfig } from "../../schema/config-load.ts";

describe("config", () => {
  it("returns the defaults for no file and no environment", () => {
    expect(resolveConfig(undefined, {})).toEqual(defaultConfig);
  });

  it("applies file values, then environment overrides", () => {
    const c = resolveConfig(
      { pages: { pageTokens: 32 }, catalog: { log: "kafka" } },
      { CONTINUUM_CATALOG_BROKERS: "a:1, b:2", PORT: "9999", CONTINUUM_STORE_S3_ENABLED: "true" },
    );
    expect(c.pages.pageTokens).toBe(32);
    expect(c.catalog.log).toBe("kafka");
    expect(c.catalog.brokers).toEqual(["a:1", "b:2"]);
    expect(c.controller.httpPort).toBe(9999);
    expect(c.store.s3.enabled).toBe(true);
  });

  it("names every bad field in one error", () => {
    try {
      resolveConfig(
        { pages: { pageTokens: 8, chunkTokens: "x" }, bogus: 1, model: { presett: "tiny" } },
        {
          CONTINUUM_SCHEDULER_MAX_BATCH_SEQS: "many",
        },
      );
      expect.unreachable();
    } catch (err) {
      expect(err).toBeInstanceOf(ConfigError);
      const problems = (err as ConfigError).problems.join("\n");
      expect(problems).toContain("pages.pageTokens: 8 is outside 16..32");
      expect(problems).toContain("pages.chunkTokens: expected an integer");
      expect(problems).toContain("bogus: unknown setting");
      expect(problems).toContain("model.presett: unknown setting");
      expect(problems).toContain("CONTINUUM_SCHEDULER_MAX_BATCH_SEQS");
    }
  });

  it("derives environment names in upper snake case", () => {
    expect(configEnvName("store.s3.multipartThresholdBytes")).toBe(
      "CONTINUUM_STORE_S3_MULTIPART_THRESHOLD_BYTES",
    );
  });

  it("does not share nested objects with the defaults", () => {
    const c = resolveConfig(undefined, {});
    c.catalog.brokers.push("x");
    expect(defaultConfig.catalog.brokers).toEqual(["127.0.0.1:9092"]);
  });

  it("takes model.variant as auto or a variant name, and refuses anything else naming the field", () => {
    expect(resolveConfig(undefined, {}).model.variant).toBe("auto");
    const named = "cuda-sm90-cu13.0/gemm-mma16816.f32acc.k256+attn-mma.hilo.s512/v1";
    expect(resolveConfig({ model: { variant: named } }, {}).model.variant).toBe(named);
    expect(resolveConfig(undefined, { CONTINUUM_MODEL_VARIANT: "cpu-f32acc/v1" }).model.variant).toBe(
      "cpu-f32acc/v1",
    );
    for (const bad of ["", "CPU/v1", "cpu f32", "/v1", "cpu//v1", "cpu/", "x".repeat(201), 7]) {
      try {
        resolveConfig({ model: { variant: bad } }, {});
        expect.unreachable(`${JSON.stringify(bad)} was accepted`);
      } catch (err) {
        expect(err).toBeInstanceOf(ConfigError);
        expect((err as ConfigError).problems.join("\n")).toMatch(/^model\.variant: /);
      }
    }
  });
});
