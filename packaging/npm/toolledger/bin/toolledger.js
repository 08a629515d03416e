#!/usr/bin/env node
// The `toolledger` command of the npm package `toolledger`: finds the native binary in the
// platform package npm installed beside this one (one of this package's optionalDependencies,
// `@toolledger/cli-<platform>-<arch>`), runs it with this process's arguments and stdio, forwards
// SIGINT, SIGTERM and SIGHUP to it, and exits as it exited (same code, or the same signal).
//
// TOOLLEDGER_BINARY=/path/to/toolledger runs that binary instead.
"use strict";

const { spawn } = require("node:child_process");
const path = require("node:path");

const SCOPE = "@toolledger";
const platform = process.platform;
const arch = process.arch;
const exe = platform === "win32" ? ".exe" : "";

function fail(message) {
  process.stderr.write(`toolledger: ${message}\n`);
  process.exit(1);
}

// The platform packages this release declares (its optionalDependencies).
function declaredPlatformPackages() {
  try {
    const manifest = require(path.join(__dirname, "..", "package.json"));
    return Object.keys(manifest.optionalDependencies || {}).filter((name) =>
      name.startsWith(`${SCOPE}/cli-`),
    );
  } catch {
    return [];
  }
}

// glibc or musl on Linux: Node reports the glibc version it runs on, and none on musl.
function isMusl() {
  if (platform !== "linux") return false;
  try {
    const report = process.report && process.report.getReport();
    const header = report && (typeof report === "string" ? JSON.parse(report) : report).header;
    return !!header && !header.glibcVersionRuntime;
  } catch {
    return false;
  }
}

function findBinary() {
  if (process.env.TOOLLEDGER_BINARY) return process.env.TOOLLEDGER_BINARY;
  const pkg = `${SCOPE}/cli-${platform}-${arch}`;
  const declared = declaredPlatformPackages();
  if (declared.length > 0 && !declared.includes(pkg)) {
    fail(
      `no prebuilt binary for ${platform}-${arch} (prebuilt: ${declared
        .map((name) => name.slice(`${SCOPE}/cli-`.length))
        .join(", ")}).\n` +
        "Install it with `cargo install toolledger-cli`, or `pip install toolledger` where a wheel exists;\n" +
        "see https://github.com/toolledger/toolledger/blob/main/docs/install.md",
    );
  }
  if (isMusl()) {
    fail(
      "the prebuilt Linux binaries need glibc, and this system uses musl.\n" +
        "Install it with `cargo install toolledger-cli` instead; see\n" +
        "https://github.com/toolledger/toolledger/blob/main/docs/install.md",
    );
  }
  try {
    return require.resolve(`${pkg}/bin/toolledger${exe}`);
  } catch {
    fail(
      `the package ${pkg}, which holds the binary for this platform, is not installed.\n` +
        "npm installs it as an optional dependency of `toolledger`: it is missing when optional\n" +
        "dependencies were left out (--omit=optional, --no-optional) or when node_modules or a\n" +
        "lockfile was made on another platform. Reinstall with optional dependencies, e.g.\n" +
        `  npm install toolledger ${pkg}\n` +
        "or run `npx -y toolledger ...` again.",
    );
  }
}

const binary = findBinary();
const child = spawn(binary, process.argv.slice(2), { stdio: "inherit", windowsHide: true });

const forwarded = ["SIGINT", "SIGTERM", "SIGHUP"];
const forward = (signal) => {
  // The child may have gone already; a signal it can no longer receive is not an error.
  try {
    child.kill(signal);
  } catch {}
};
for (const signal of forwarded) process.on(signal, forward);

child.on("error", (err) => {
  fail(`could not start ${binary}: ${err.message}`);
});

child.on("exit", (code, signal) => {
  for (const s of forwarded) process.removeListener(s, forward);
  if (signal) {
    // Die of the same signal, so that whoever started us sees what happened to the binary.
    process.kill(process.pid, signal);
    // Signals Node cannot re-raise on this platform: the shell's convention.
    setTimeout(() => process.exit(128 + (require("node:os").constants.signals[signal] || 0)), 100);
    return;
  }
  process.exit(code === null ? 1 : code);
});
