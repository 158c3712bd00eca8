#!/usr/bin/env node
// solc-js behind the command-line interface forge expects of a native solc:
// `--version`, and `--standard-json` reading the input on stdin. forge would
// otherwise download a native compiler, which cannot work offline.
import { readFileSync } from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const solc = require("solc");
const args = process.argv.slice(2);

if (args.includes("--version")) {
  process.stdout.write(`solc, the solidity compiler commandline interface\nVersion: ${solc.version()}\n`);
  process.exit(0);
}
if (!args.includes("--standard-json")) {
  process.stderr.write("scripts/solc.mjs supports only --version and --standard-json\n");
  process.exit(2);
}

// Sources forge did not inline are read from the base and include paths it passes.
const roots = [];
for (let i = 0; i < args.length; i++) {
  if (args[i] === "--base-path" || args[i] === "--include-path") roots.push(args[++i]);
}
roots.push(process.cwd());

function findImports(importPath) {
  for (const root of roots) {
    try {
      return { contents: readFileSync(path.resolve(root, importPath), "utf8") };
    } catch {
      // try the next root
    }
  }
  return { error: `file not found: ${importPath}` };
}

const input = readFileSync(0, "utf8");
process.stdout.write(solc.compile(input, { import: findImports }));
