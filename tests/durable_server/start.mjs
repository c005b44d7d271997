// Starts the Durable Streams reference server for s2-spark's tests.
// Usage: node start.mjs [--port N] [--data-dir DIR] [--long-poll-timeout MS] [--page-messages N]
// --page-messages N: a catch-up read answers at most N stored messages (one per append)
// and, when it stops before the tail, without Stream-Up-To-Date, so clients must read on
// from its Stream-Next-Offset. The protocol allows this; the reference server never does it
// on its own, so this lets tests exercise paging against the real server.
// Prints "listening <port>" once it accepts connections; stops on SIGTERM/SIGINT or when
// stdin closes (so a crashed test run never leaves it behind).
import { DurableStreamTestServer } from "@durable-streams/server";

const args = process.argv.slice(2);
const opts = { port: 0, host: "127.0.0.1", longPollTimeout: 30000 };
let pageMessages;
for (let i = 0; i < args.length; i += 2) {
  const [name, value] = [args[i], args[i + 1]];
  if (value === undefined) throw new Error(`missing value for ${name}`);
  if (name === "--port") opts.port = Number(value);
  else if (name === "--data-dir") opts.dataDir = value;
  else if (name === "--long-poll-timeout") opts.longPollTimeout = Number(value);
  else if (name === "--page-messages") pageMessages = Number(value);
  else {
    throw new Error(
      `unknown option ${name}; accepted: --port --data-dir --long-poll-timeout --page-messages`,
    );
  }
}
if (pageMessages !== undefined && !(Number.isInteger(pageMessages) && pageMessages >= 1)) {
  throw new Error(`--page-messages must be a whole number >= 1 (got ${pageMessages})`);
}
const server = new DurableStreamTestServer(opts);
if (pageMessages !== undefined) pageReads(server.store, pageMessages);
await server.start();
const port = new URL(server.url).port;
process.stdout.write(`listening ${port}\n`);

let stopping = false;
async function stop() {
  if (stopping) return;
  stopping = true;
  await server.stop();
  process.exit(0);
}
process.on("SIGTERM", stop);
process.on("SIGINT", stop);
process.stdin.on("end", stop);
process.stdin.resume();

// Makes `store` (in memory or file-backed: both have read(path, offset) -> {messages,
// upToDate}, each message carrying its offset) answer at most `limit` messages per read,
// saying upToDate: false when it stopped short. The GET handler then sets Stream-Next-Offset
// to the last message's offset and leaves out Stream-Up-To-Date; the SSE loop sends a
// control event without upToDate and reads on at once.
//
// The store's long-poll code (waitForMessages, and notifyLongPolls, which wakes waiting
// long-polls on append) calls this.read too, and the GET handler marks a woken long-poll's
// answer up to date whatever it holds; those reads stay whole so that flag stays true.
function pageReads(store, limit) {
  const wholeRead = store.read.bind(store);
  let whole = 0; // > 0 while inside the long-poll code (synchronous: Node is one thread)
  store.read = (path, offset) => {
    const result = wholeRead(path, offset);
    if (whole > 0 || result.messages.length <= limit) return result;
    return { ...result, messages: result.messages.slice(0, limit), upToDate: false };
  };
  for (const name of ["waitForMessages", "notifyLongPolls"]) {
    const method = store[name].bind(store);
    store[name] = (...args) => {
      whole += 1;
      try {
        return method(...args); // an async method reads before its first await: covered
      } finally {
        whole -= 1;
      }
    };
  }
}
