import pkg from "../../package.json" with { type: "json" };

/** What GET /version answers: the package's version. */
export const SERVER_VERSION: string = pkg.version;
