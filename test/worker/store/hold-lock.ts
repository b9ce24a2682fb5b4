// A process that takes a lock (worker/store/dir-lock.ts) and holds it until killed;
// prints "locked" once it holds it. Run: node --import tsx test/worker/store/hold-lock.ts DIR
import { lockDir } from "../../../worker/store/dir-lock.ts";

lockDir(process.argv[2]!);
process.stdout.write("locked\n");
setInterval(() => {}, 60_000);
