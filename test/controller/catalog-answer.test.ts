import { describe, expect, it } from "vitest";
import { longestPublishedPrefix, readyReplicas } from "../../catalog/queries.ts";
import { deriveCandidates } from "../../controller/candidates.ts";
import { catalogAnswer } from "../../controller/catalog-answer.ts";
import type { TokenCount } from "../../schema/ids.ts";
import { CHUNK_TOKENS, randomCatalog } from "../catalog/gen.ts";
import { heartbeat, request } from "./fixtures.ts";

describe("catalog answer from a real catalog replica", () => {
  it("holds the longest published prefix and every ready RAM/SSD/S3 replica of it", () => {
    const { db, gen } = randomCatalog(7, 2_000);
    let checked = 0;
    let withReplicas = 0;
    for (const { nodes } of gen.chains()) {
      const chain = nodes.map((nodeId, i) => ({ nodeId, tokens: ((i + 1) * CHUNK_TOKENS) as TokenCount }));
      const answer = catalogAnswer(db, chain);
      expect(answer.replicas.length).toBe(longestPublishedPrefix(db, nodes).length);
      const ready = readyReplicas(db, nodes.slice(0, answer.replicas.length));
      answer.replicas.forEach((got, i) => {
        const want = ready.get(nodes[i]!)!;
        const local = want.filter((r) => r.tier === "ram" || r.tier === "ssd");
        expect(got.filter((r) => r.tier !== "s3")).toEqual(
          local.map((r) => ({ tier: r.tier, workerId: r.worker })),
        );
        expect(got.some((r) => r.tier === "s3" && r.workerId === null)).toBe(
          want.some((r) => r.tier === "s3"),
        );
        if (got.length > 0) withReplicas++;
      });
      // The answer feeds candidate derivation as is.
      if (answer.replicas.length > 0) {
        const hb = heartbeat("w0");
        const { candidates } = deriveCandidates(
          request(chain, chain.length * CHUNK_TOKENS + 1),
          [{ heartbeat: hb, ageMs: 0 }],
          answer,
          { residentFreshMs: 1000 },
        );
        expect(candidates.at(-1)!.source).toBe("recompute");
      }
      checked++;
    }
    expect(checked).toBeGreaterThan(10);
    expect(withReplicas).toBeGreaterThan(0);
  });
});
