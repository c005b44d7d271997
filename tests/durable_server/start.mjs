// Starts the Durable Streams reference server for s2-spark's tests.
// Usage: node start.mjs [--port N] [--data-dir DIR] [--long-poll-timeout MS]
// Prints "listening <port>" once it accepts connections; stops on SIGTERM/SIGINT or when
// stdin closes (so a crashed test run never leaves it behind).
import { DurableStreamTestServer } from "@durable-streams/server";

const args = process.argv.slice(2);
const opts = { port: 0, host: "127.0.0.1", longPollTimeout: 30000 };
for (let i = 0; i < args.length; i += 2) {
  const [name, value] = [args[i], args[i + 1]];
  if (value === undefined) throw new Error(`missing value for ${name}`);
  if (name === "--port") opts.port = Number(value);
  else if (name === "--data-dir") opts.dataDir = value;
  else if (name === "--long-poll-timeout") opts.longPollTimeout = Number(value);
  else throw new Error(`unknown option ${name}; accepted: --port --data-dir --long-poll-timeout`);
}
const server = new DurableStreamTestServer(opts);
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
