/**
 * The one configuration object. Loaded from a JSON or YAML file (`--config`),
 * then `CONTINUUM_<SECTION>_<FIELD>` environment overrides (field names in
 * upper snake case: `CONTINUUM_CATALOG_BROKERS`, `CONTINUUM_STORE_S3_ENDPOINT`),
 * plus `PORT` for the HTTP API. Validated once at start-up; every bad field is
 * named in one error.
 *
 * To add a field: add it to `Config`, give it a default in `defaultConfig`,
 * and a rule in `rules` (config-rules.ts). Loading and validation are in
 * config-load.ts. Unknown keys in a file are errors (a typo must not
 * silently fall back to a default).
 */
export interface Config {
  model: {
    /** A Hugging Face model directory; empty means the generated preset. */
    dir: string;
    /** Preset written under data dir when `dir` is empty. */
    preset: "tiny" | "small" | "bench";
    /** A Jinja chat template file replacing the model's own (vLLM's --chat-template); empty: the model's. */
    chatTemplate: string;
    /** How tool calls are read out of the text (vLLM's --tool-call-parser); auto: from the template's markup. */
    toolCallParser: "auto" | "none" | "hermes" | "llama3_json" | "mistral";
    /**
     * The execution variant in the model fingerprint: the numerics the K/V
     * bytes depend on (worker/model/variant.ts), so chunks are shared only
     * between engines that compute the same bits. "auto": a worker or `serve`
     * takes its engine's own (cpu-f32acc/v1, or cuda-sm90-cu13.0/… on a
     * GPU); the controller routes to workers of the CPU engine's. A named
     * variant: the controller routes to workers of that variant (set it for a
     * fleet of GPU workers; a worker logs its variant at start), and a worker
     * or `serve` whose engine computes another refuses to start.
     */
    variant: string;
  };
  pages: {
    /** Tokens per KV page (16–32). */
    pageTokens: number;
    /** Physical pages in the pool; bounds resident capacity. */
    physicalPages: number;
    /** Tokens per durable chunk (128–512). */
    chunkTokens: number;
  };
  scheduler: {
    /** Tokens processed per iteration across all lanes. */
    maxBatchTokens: number;
    /** Sequences per iteration. */
    maxBatchSeqs: number;
    /** Tokens reserved for prefill each iteration so it never starves. */
    minPrefillTokens: number;
    /** Rows per prefill tile of one long prompt. */
    prefillTile: number;
    /**
     * While requests decode, a step with prefill rows may take at most this
     * many times the decode-only step it replaces, as the runtime's fitted
     * step-cost model predicts it (prefill tiles shrink to fit, down to
     * minPrefillTokens); 0 turns pacing off and tiles are always prefillTile.
     */
    decodePace: number;
  };
  store: {
    /** Root for local data: store files, embedded log, generated models. */
    dataDir: string;
    ram: { maxBytes: number };
    /** Chunk files (the SSD tier); maxBytes bounds what they hold, frames included (FileTier). */
    dir: { path: string; maxObjectBytes: number; maxBytes: number };
    s3: {
      enabled: boolean;
      endpoint: string;
      bucket: string;
      region: string;
      accessKeyId: string;
      secretAccessKey: string;
      multipartThresholdBytes: number;
      maxAttempts: number;
      writeBehindQueue: number;
      /** Multipart part size (S3's minimum is 5 MiB, except the last part). */
      partBytes: number;
      /** Parts of one multipart upload in flight at once. */
      partConcurrency: number;
      /** Deadline of one S3 request attempt (a stopped server never hangs a caller). */
      requestTimeoutMs: number;
      /** First retry delay; doubles per attempt (bounded by maxAttempts). */
      retryBaseMs: number;
      /** Bytes the write-behind queue may hold at once (besides its job count). */
      writeBehindBytes: number;
      /** Uploads running at once from the write-behind queue. */
      writeBehindConcurrency: number;
      /** How long a required write waits for room in a full write-behind queue. */
      requiredWaitMs: number;
      /** Create the bucket at start-up when it is missing (local S3 servers). */
      createBucket: boolean;
    };
  };
  catalog: {
    log: "embedded" | "kafka";
    brokers: string[];
    clientId: string;
    topics: { proposals: string; tx: string; rejections: string };
    snapshotEvery: number;
  };
  controller: {
    host: string;
    httpPort: number;
    workerPort: number;
    heartbeatTtlMs: number;
    offerTimeoutMs: number;
    /** Accept → first token, and between token frames, before an attempt fails over. */
    progressTimeoutMs: number;
    /** A worker's resident prefixes are trusted for this long after its heartbeat. */
    residentFreshMs: number;
    /**
     * How a request picks its worker: "ttft" ranks every worker's candidates by
     * predicted time to first token (cache-aware); "round_robin" takes the live
     * workers in turn, ignoring where prefixes are (a baseline to compare with).
     */
    routing: "ttft" | "round_robin";
    /**
     * Worker id → that worker's own token for the worker socket (besides
     * auth.clusterSecret). A worker listed here must present its token; the
     * shared secret then admits only workers not listed.
     */
    workerTokens: Record<string, string>;
    /**
     * The operator's web view at /ui on the HTTP port (the page is static; its
     * live data and Datalog box sit behind auth.tokens like the API); false: no /ui.
     */
    ui: boolean;
    /**
     * Multipliers of the router's TTFT terms: predicted = max(queue·q, fetch·f)
     * + upload·u + prefill·p + firstToken·t. 1 each is the calibrated cost
     * model; `continuum replay` says which term the measured outcomes disagree
     * with and predicts the recorded workload under other weights.
     */
    ttftWeights: { queue: number; fetch: number; upload: number; prefill: number; firstToken: number };
    /** This controller's name in the catalog (proposals, the placement lease's holder, with a per-process suffix). */
    id: string;
    /**
     * The placement authority (controller/placement/): under an epoch-fenced
     * catalog lease, one controller of the fleet at a time turns demand into
     * placement.set facts that workers prefetch.
     */
    placement: {
      enabled: boolean;
      /** One lease renewal and at most one plan per interval. */
      intervalMs: number;
      /** The lease lasts this long past each renewal (the writer's clock); a standby takes over after it lapses. */
      leaseTtlMs: number;
      /** Demand counts halve after this long. */
      halfLifeMs: number;
      /** Placed bytes per worker in RAM and in SSD (the plan's budget; workers bound their own prefetch too). */
      ramBytesPerWorker: number;
      ssdBytesPerWorker: number;
      /** Copies of one chunk at most. */
      maxReplicas: number;
      /** Decayed requests below which a prefix is not placed. */
      minDemand: number;
      /** Replicas grow as 1 + ⌊demand share × workers × spread⌋. */
      spread: number;
      /** placement.set changes per plan at most. */
      maxChanges: number;
      /** Demand observations are summed over this window before they are proposed. */
      demandWindowMs: number;
    };
    /** The HTTP API's connection bounds (controller/api/connections.ts says what each does). */
    http: {
      /** A new connection's first request headers, and any later request's headers, must arrive within this. */
      headersTimeoutMs: number;
      /** A whole request (headers and body) must arrive within this; else 408. */
      requestTimeoutMs: number;
      /** A kept-alive connection with no request in flight is closed after this. */
      idleTimeoutMs: number;
      /** Open connections at most: one more sheds the longest-idle one, or is answered 503 when none is idle. */
      maxConnections: number;
      /** Stream bytes a client may leave unread; past it the request is cancelled and the connection closed. */
      maxUnsentBytes: number;
    };
    /** Request size limits, checked before anything is tokenized (controller/api/limits.ts). */
    limits: {
      /** Largest request body; more is answered 413. */
      maxBodyBytes: number;
      /** UTF-8 bytes of all prompt text of one request; more is answered 400. */
      maxPromptBytes: number;
      /** Chat messages in one request; more is answered 400. */
      maxMessages: number;
      /** Threads that tokenize and render large prompts beside the event loop. */
      tokenizerThreads: number;
      /** Requests waiting for a tokenizer thread at most; one more is answered 503. */
      tokenizerQueue: number;
    };
    /** Bounds of POST /v1/catalog/query (catalog/query-engine.ts). */
    catalogQuery: {
      /** A query running longer is cancelled (its thread terminated); 400. */
      timeoutMs: number;
      /** A result with more rows is refused; 400. */
      maxResultRows: number;
      /** A result with more bytes of JSON is refused; 400. */
      maxResultBytes: number;
      /** The query thread's heap (its catalog copy included); a query that reaches it is cancelled; 400. */
      maxHeapMb: number;
      /** Queries waiting at most while one runs; one more is answered 503. */
      maxQueued: number;
    };
    /** Origins allowed to call the API from a browser ("*": any); empty: CORS off. */
    corsOrigins: string[];
  };
  worker: {
    index: number;
    id: string;
    controllerUrl: string;
    peerPortBase: number;
    /**
     * The address this worker's peer server listens on and publishes in the
     * catalog for other workers to fetch chunks from (a pod's IP on Kubernetes).
     */
    peerHost: string;
    /** Heartbeat interval; keep it well under controller.heartbeatTtlMs and residentFreshMs. */
    heartbeatIntervalMs: number;
    /** CPU backend compute threads; 0 = all cores. */
    threads: number;
    /**
     * Native engine backend: auto = CUDA when the addon was built with it and
     * a device is present, else CPU; cuda without either fails at start saying
     * which. Env: CONTINUUM_WORKER_BACKEND.
     */
    backend: "auto" | "cpu" | "cuda";
    /**
     * Durable prefix reuse: checkpoints (capture finished prefixes into RAM,
     * chunk files and S3, publish them in the catalog) and restores (load a
     * published prefix from any tier or peer instead of recomputing it).
     * false: neither; the worker reuses only prefixes still resident in its own
     * page pool and advertises no durable tiers (a baseline to compare with).
     */
    durableReuse: boolean;
    /** This worker's token for the controller's socket (controller.workerTokens); empty: auth.clusterSecret. */
    token: string;
    /**
     * Workers read each other's RAM/SSD chunks over the peer port; false: S3
     * is the only tier they share (the worker neither serves nor reads peer
     * chunks, and the controller, reading the same fleet config, derives no
     * peer candidates).
     */
    peerTransfer: boolean;
    /**
     * The warm-start tier probe's reads become each tier's first restore-cost
     * sample (worker/warm/warm-start.ts); false: the configured priors stand
     * until real restores measure the tiers.
     */
    probeCosts: boolean;
    /**
     * Restore costs, ms per byte, before a tier is measured (by the probe, or
     * by real restores): what the router and the worker's restore plan price
     * an unmeasured tier at.
     */
    restorePriorMsPerByte: { ram: number; ssd: number; peer: number; s3: number };
    /**
     * Prefetch (worker/prefetch/): chunks the placement authority placed on
     * this worker are pulled into its RAM/SSD ahead of demand, beside the
     * runtime loop. Needs durableReuse.
     */
    prefetch: {
      enabled: boolean;
      /** Prefetches waiting at once; one more placement is skipped (and logged). */
      maxQueued: number;
      /** Placed bytes held pinned in RAM at most (clamped below store.ram.maxBytes by one chunk). */
      ramBytes: number;
      /** Placed bytes this worker fetches into its chunk files at most. */
      ssdBytes: number;
      /** Deadline of one fetch from one source (a peer, S3). */
      fetchTimeoutMs: number;
      /** A prefetch waits while prompts wait to prefill, at most this long. */
      maxDeferMs: number;
      /** Skipped or unreadable placements are tried again this often. */
      retryMs: number;
    };
  };
  auth: {
    /** Bearer token → tenant. Empty: no auth, every request is tenant "default". */
    tokens: Record<string, string>;
    /** Shared secret workers present to the controller and to peers. */
    clusterSecret: string;
    /** Tenants (values of `tokens`) that are admins: the whole catalog, /metrics and /workers. */
    adminTenants: string[];
    /** The scrape token for /metrics and /workers (an admin's token works too); empty: none. */
    metricsToken: string;
  };
}

export const defaultConfig: Config = {
  model: { dir: "", preset: "tiny", variant: "auto", chatTemplate: "", toolCallParser: "auto" },
  pages: { pageTokens: 16, physicalPages: 4096, chunkTokens: 256 },
  scheduler: {
    maxBatchTokens: 512,
    maxBatchSeqs: 64,
    minPrefillTokens: 64,
    prefillTile: 256,
    decodePace: 1.8,
  },
  store: {
    dataDir: ".continuum",
    ram: { maxBytes: 1 << 30 },
    dir: { path: "", maxObjectBytes: 256 << 20, maxBytes: 32 * 2 ** 30 },
    s3: {
      enabled: false,
      endpoint: "http://127.0.0.1:9000",
      bucket: "continuum",
      region: "us-east-1",
      accessKeyId: "continuum",
      secretAccessKey: "continuum-secret",
      multipartThresholdBytes: 16 << 20,
      maxAttempts: 4,
      writeBehindQueue: 64,
      partBytes: 8 << 20,
      partConcurrency: 4,
      requestTimeoutMs: 30_000,
      retryBaseMs: 100,
      writeBehindBytes: 512 << 20,
      writeBehindConcurrency: 2,
      requiredWaitMs: 30_000,
      createBucket: false,
    },
  },
  catalog: {
    log: "embedded",
    brokers: ["127.0.0.1:9092"],
    clientId: "continuum",
    topics: { proposals: "catalog.proposals", tx: "catalog.tx", rejections: "catalog.rejections" },
    snapshotEvery: 10_000,
  },
  controller: {
    host: "127.0.0.1",
    httpPort: 8080,
    workerPort: 8081,
    heartbeatTtlMs: 3_000,
    offerTimeoutMs: 5_000,
    progressTimeoutMs: 10_000,
    residentFreshMs: 1_500,
    routing: "ttft",
    workerTokens: {},
    ui: true,
    ttftWeights: { queue: 1, fetch: 1, upload: 1, prefill: 1, firstToken: 1 },
    id: "controller",
    placement: {
      enabled: true,
      intervalMs: 2_000,
      leaseTtlMs: 10_000,
      halfLifeMs: 60_000,
      ramBytesPerWorker: 256 << 20,
      ssdBytesPerWorker: 1 << 30,
      maxReplicas: 4,
      minDemand: 2,
      spread: 2,
      maxChanges: 256,
      demandWindowMs: 2_000,
    },
    http: {
      headersTimeoutMs: 10_000,
      requestTimeoutMs: 60_000,
      idleTimeoutMs: 5_000,
      maxConnections: 1024,
      maxUnsentBytes: 4 * 1024 * 1024,
    },
    limits: {
      maxBodyBytes: 8 * 1024 * 1024,
      maxPromptBytes: 4 * 1024 * 1024,
      maxMessages: 4096,
      tokenizerThreads: 2,
      tokenizerQueue: 64,
    },
    catalogQuery: {
      timeoutMs: 10_000,
      maxResultRows: 100_000,
      maxResultBytes: 8 * 1024 * 1024,
      maxHeapMb: 512,
      maxQueued: 8,
    },
    corsOrigins: [],
  },
  worker: {
    index: 0,
    id: "worker-0",
    controllerUrl: "ws://127.0.0.1:8081",
    peerPortBase: 8090,
    peerHost: "127.0.0.1",
    heartbeatIntervalMs: 500,
    threads: 0,
    backend: "auto",
    durableReuse: true,
    token: "",
    peerTransfer: true,
    probeCosts: true,
    restorePriorMsPerByte: { ram: 1e-6, ssd: 1e-5, peer: 2e-5, s3: 1e-4 },
    prefetch: {
      enabled: true,
      maxQueued: 16,
      ramBytes: 256 << 20,
      ssdBytes: 1 << 30,
      fetchTimeoutMs: 10_000,
      maxDeferMs: 10_000,
      retryMs: 5_000,
    },
  },
  auth: { tokens: {}, clusterSecret: "", adminTenants: [], metricsToken: "" },
};
