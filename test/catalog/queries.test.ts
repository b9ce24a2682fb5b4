import datascript from "datascript";
import { describe, expect, it } from "vitest";
import { CatalogDb } from "../../catalog/db.ts";
import {
  DemandIndex,
  longestPublishedPrefix,
  longestPublishedPrefixOfChain,
  readyPrefixByWorkerTier,
  readyReplicas,
} from "../../catalog/queries.ts";
import type { Proposal } from "../../schema/catalog.ts";
import { CatalogGen, randomCatalog } from "./gen.ts";

const SEEDS = [3, 17, 42];

function q<T>(query: string, ...inputs: unknown[]): T {
  return datascript.q(query, ...inputs) as T;
}

describe("prepared queries agree with Datalog", () => {
  for (const seed of SEEDS) {
    it(`longest published prefix, ready replicas and ready runs by worker/tier (seed ${seed})`, () => {
      const { db, gen } = randomCatalog(seed, 3_000);
      const ddb = db.datalog();
      let longest = 0;
      for (const { model, nodes, prefixes } of gen.chains()) {
        const published = new Set(
          q<string[]>('[:find [?n ...] :in $ [?n ...] :where [?c "chunk/node" ?n]]', ddb, nodes),
        );
        let expected = 0;
        while (expected < nodes.length && published.has(nodes[expected]!)) expected++;
        const prefix = longestPublishedPrefix(db, nodes);
        expect(prefix.length).toBe(expected);
        const byPrefix = longestPublishedPrefixOfChain(
          db,
          model,
          prefixes.map((hash) => ({ hash })),
        );
        expect(byPrefix).toEqual(prefix);
        longest = Math.max(longest, expected);

        const rows = q<[string, string, string, number][]>(
          `[:find ?n ?w ?tier ?at :in $ [?n ...]
            :where [?c "chunk/node" ?n] [?r "replica/chunk" ?c] [?r "replica/state" "ready"]
                   [?r "replica/worker" ?we] [?we "worker/id" ?w] [?r "replica/tier" ?tier]
                   [?r "replica/verified-at" ?at]]`,
          ddb,
          nodes,
        );
        const fromDatalog = rows.map((r) => r.join(" ")).sort();
        const prepared: string[] = [];
        for (const [n, reps] of readyReplicas(db, nodes))
          for (const r of reps) prepared.push(`${n} ${r.worker} ${r.tier} ${r.verifiedAt}`);
        expect(prepared.sort()).toEqual([...new Set(fromDatalog)]);

        // Runs from the root by worker and tier, derived from the Datalog rows.
        const ready = new Set(rows.map(([n, w, t]) => `${n} ${w} ${t}`));
        const expectedRuns = new Map<string, number>();
        for (const [, w, t] of rows) {
          let k = 0;
          while (k < expected && ready.has(`${nodes[k]} ${w} ${t}`)) k++;
          if (k > 0) expectedRuns.set(`${w} ${t}`, k);
        }
        const runs = new Map<string, number>();
        for (const [w, byTier] of readyPrefixByWorkerTier(db, prefix))
          for (const [t, k] of byTier) runs.set(`${w} ${t}`, k);
        expect(runs).toEqual(expectedRuns);
      }
      expect(longest).toBeGreaterThan(3); // the catalogs are deep enough to mean something
    });
  }

  it("demand and reuse by bucket, tenant and model, kept current from tx reports", () => {
    const gen = new CatalogGen(5);
    const db = CatalogDb.empty();
    const index = new DemandIndex(db, 60_000);
    const proposals: Proposal[] = [gen.setup()];
    for (let i = 0; i < 4_000; i++) proposals.push(gen.next());
    for (const p of proposals) {
      const r = db.resolve(p, 1);
      if (!r.ok) continue;
      const tx = { txNo: db.nextTxNo, proposalId: p.id, clientId: p.clientId, time: 1, datoms: r.datoms };
      db.apply(tx);
      index.onReports([{ offset: tx.txNo - 1, tx }]);
    }
    const ddb = db.datalog();
    const times = q<number[]>('[:find [?t ...] :where [_ "demand/time" ?t]]', ddb).sort((a, b) => a - b);
    const from = Math.floor(times[Math.floor(times.length / 4)]! / 60_000) * 60_000;
    const to = Math.floor(times[Math.floor((3 * times.length) / 4)]! / 60_000) * 60_000;
    const demandRows = q<[number, string, string, number][]>(
      `[:find ?b ?tenant ?fp (sum ?c) :with ?d :in $ ?from ?to
        :where [?d "demand/time" ?time] [(>= ?time ?from)] [(< ?time ?to)]
               [(quot ?time 60000) ?q] [(* ?q 60000) ?b]
               [?d "demand/tenant" ?tenant] [?d "demand/model" ?m] [?m "model/fingerprint" ?fp]
               [?d "demand/count" ?c]]`,
      ddb,
      from,
      to,
    );
    expect(demandRows.length).toBeGreaterThan(5);
    const key = (b: number, t: string, m: string) => `${b} ${t} ${m}`;
    expect(
      new Map(index.demand({ from, to }).map((r) => [key(r.bucket, r.tenant, r.model), r.count])),
    ).toEqual(new Map(demandRows.map(([b, t, m, c]) => [key(b, t, m), c])));
    const tenant = demandRows[0]![1];
    expect(index.demand({ from, to, tenant }).every((r) => r.tenant === tenant)).toBe(true);
    expect(index.demand({ from, to, tenant }).length).toBe(demandRows.filter((r) => r[1] === tenant).length);

    const all = { from: 0, to: Number.MAX_SAFE_INTEGER };
    const decisions = q<[number, string, string, number, number][]>(
      `[:find ?b ?tenant ?fp (count ?d) (sum ?ct)
        :where [?d "decision/time" ?time] [(quot ?time 60000) ?q] [(* ?q 60000) ?b]
               [?d "decision/tenant" ?tenant] [?d "decision/model" ?m] [?m "model/fingerprint" ?fp]
               [?d "decision/cached-tokens" ?ct]]`,
      ddb,
    );
    const reusedRows = q<[number, string, string, number][]>(
      `[:find ?b ?tenant ?fp (count ?d)
        :where [?d "decision/time" ?time] [(quot ?time 60000) ?q] [(* ?q 60000) ?b]
               [?d "decision/source" ?s] [(not= ?s "recompute")]
               [?d "decision/tenant" ?tenant] [?d "decision/model" ?m] [?m "model/fingerprint" ?fp]]`,
      ddb,
    );
    // (sum ?ct) without :with would collapse equal values; recount with :with for the token sum.
    const tokenRows = q<[number, string, string, number][]>(
      `[:find ?b ?tenant ?fp (sum ?ct) :with ?d
        :where [?d "decision/time" ?time] [(quot ?time 60000) ?q] [(* ?q 60000) ?b]
               [?d "decision/tenant" ?tenant] [?d "decision/model" ?m] [?m "model/fingerprint" ?fp]
               [?d "decision/cached-tokens" ?ct]]`,
      ddb,
    );
    const reusedBy = new Map(reusedRows.map(([b, t, m, n]) => [key(b, t, m), n]));
    const tokensBy = new Map(tokenRows.map(([b, t, m, n]) => [key(b, t, m), n]));
    const expected = new Map(
      decisions.map(([b, t, m, n]) => [
        key(b, t, m),
        `${n} ${reusedBy.get(key(b, t, m)) ?? 0} ${tokensBy.get(key(b, t, m))}`,
      ]),
    );
    expect(expected.size).toBeGreaterThan(5);
    expect(
      new Map(
        index
          .reuse(all)
          .map((r) => [key(r.bucket, r.tenant, r.model), `${r.decisions} ${r.reused} ${r.cachedTokens}`]),
      ),
    ).toEqual(expected);

    // An index built from the finished db equals the one fed by reports.
    const rebuilt = new DemandIndex(db, 60_000);
    expect(rebuilt.demand(all)).toEqual(index.demand(all));
    expect(rebuilt.reuse(all)).toEqual(index.reuse(all));
  });
});
