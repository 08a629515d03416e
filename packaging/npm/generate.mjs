#!/usr/bin/env node
// Writes the npm packages of toolledger, ready for `npm pack` / `npm publish`:
//
//   OUT/toolledger/         the launcher package `toolledger`: bin/toolledger.js, which runs the
//                           binary of the platform package below; optionalDependencies on every
//                           platform package of PLATFORMS, at the same version
//   OUT/cli-<platform>/     the platform package `@toolledger/cli-<platform>`: the binary in
//                           bin/, the man page and completions in share/, `os`/`cpu` (and
//                           `libc`) so that npm installs only the one matching the machine
//
// The version is the workspace's (Cargo.toml [workspace.package] version), so the npm packages,
// the wheel and the crates are always one release.
//
// Usage:
//   node packaging/npm/generate.mjs [--out DIR] [--share DIR] [--binary PLATFORM=PATH]...
//   node packaging/npm/generate.mjs --list
//
//   --out DIR       where to write (default target/dist/npm); each package's directory is
//                   replaced
//   --share DIR     a directory holding man/man1/toolledger.1 and the completions, laid out as
//                   under a prefix's share/ (see SHARE_FILES); copied into every platform
//                   package, and the man page into the launcher too (its `man` field)
//   --binary P=PATH the built binary for platform P (e.g. linux-x64=target/release/toolledger);
//                   repeat for each platform built. A platform package is written only for the
//                   platforms given a binary; the launcher always declares all of PLATFORMS.
//   --list          print the platforms (name, npm package, Rust target), one per line
import * as fs from "node:fs";
import * as path from "node:path";
import { fileURLToPath } from "node:url";

const HERE = path.dirname(fileURLToPath(import.meta.url));
const REPO = path.resolve(HERE, "..", "..");
const SCOPE = "@toolledger";
const REPOSITORY_URL = "https://github.com/toolledger/toolledger";

// Every platform a release declares. `node`'s process.platform / process.arch name the package
// (the launcher looks for `${SCOPE}/cli-${process.platform}-${process.arch}`); `target` is the
// Rust target its binary is built for.
const PLATFORMS = [
  { name: "linux-x64", os: "linux", cpu: "x64", libc: "glibc", target: "x86_64-unknown-linux-gnu" },
  { name: "linux-arm64", os: "linux", cpu: "arm64", libc: "glibc", target: "aarch64-unknown-linux-gnu" },
  { name: "darwin-x64", os: "darwin", cpu: "x64", target: "x86_64-apple-darwin" },
  { name: "darwin-arm64", os: "darwin", cpu: "arm64", target: "aarch64-apple-darwin" },
  { name: "win32-x64", os: "win32", cpu: "x64", target: "x86_64-pc-windows-msvc" },
];

// What a platform package carries under share/ (relative to --share), when present.
const SHARE_FILES = [
  "man/man1/toolledger.1",
  "bash-completion/completions/toolledger",
  "zsh/site-functions/_toolledger",
  "fish/vendor_completions.d/toolledger.fish",
];

const packageName = (platform) => `${SCOPE}/cli-${platform.name}`;

function die(message) {
  process.stderr.write(`generate.mjs: ${message}\n`);
  process.exit(2);
}

function workspaceVersion() {
  const text = fs.readFileSync(path.join(REPO, "Cargo.toml"), "utf8");
  const section = text.split(/^\[workspace\.package\]\s*$/m)[1];
  const match = section && section.split(/^\[/m)[0].match(/^version\s*=\s*"([^"]+)"/m);
  if (!match) die("no version in Cargo.toml's [workspace.package]");
  return match[1];
}

// A cheap check that a binary is for the platform it is packaged as: the executable format and
// the machine in its header.
function checkBinary(platform, file) {
  const fd = fs.openSync(file, "r");
  const head = Buffer.alloc(20);
  fs.readSync(fd, head, 0, 20, 0);
  fs.closeSync(fd);
  let format;
  let machine;
  if (head.readUInt32BE(0) === 0x7f454c46) {
    format = "linux";
    machine = { 0x3e: "x64", 0xb7: "arm64" }[head.readUInt16LE(18)];
  } else if (head.readUInt32LE(0) === 0xfeedfacf) {
    format = "darwin";
    machine = { 0x01000007: "x64", 0x0100000c: "arm64" }[head.readUInt32LE(4)];
  } else if (head.toString("latin1", 0, 2) === "MZ") {
    format = "win32";
    machine = platform.cpu; // the PE machine field lies further in; the format is enough here
  }
  if (format !== platform.os || machine !== platform.cpu) {
    die(`${file} is not a ${platform.name} executable (found ${format || "an unknown format"}, ${machine || "unknown cpu"})`);
  }
}

function writeJson(file, value) {
  fs.writeFileSync(file, JSON.stringify(value, null, 2) + "\n");
}

function copyLicenses(dir) {
  for (const name of ["LICENSE-MIT", "LICENSE-APACHE"]) {
    fs.copyFileSync(path.join(REPO, name), path.join(dir, name));
  }
}

function common(version) {
  return {
    version,
    license: "MIT OR Apache-2.0",
    homepage: REPOSITORY_URL,
    repository: { type: "git", url: `git+${REPOSITORY_URL}.git` },
    bugs: `${REPOSITORY_URL}/issues`,
  };
}

function writeLauncher(out, version, share) {
  const dir = path.join(out, "toolledger");
  fs.rmSync(dir, { recursive: true, force: true });
  fs.mkdirSync(path.join(dir, "bin"), { recursive: true });
  const launcher = path.join(dir, "bin", "toolledger.js");
  fs.copyFileSync(path.join(HERE, "toolledger", "bin", "toolledger.js"), launcher);
  fs.chmodSync(launcher, 0o755);
  fs.copyFileSync(path.join(HERE, "toolledger", "README.md"), path.join(dir, "README.md"));
  copyLicenses(dir);
  const files = ["bin/toolledger.js", "README.md", "LICENSE-MIT", "LICENSE-APACHE"];
  const manifest = {
    name: "toolledger",
    ...common(version),
    description:
      "A durable ledger for side-effecting MCP tool calls: put `toolledger proxy` in front of any MCP server for replayed retries and explicit outcome_unknown.",
    keywords: ["mcp", "model-context-protocol", "idempotency", "ledger", "proxy", "agents"],
    bin: { toolledger: "bin/toolledger.js" },
    files,
    engines: { node: ">=18" },
    optionalDependencies: Object.fromEntries(PLATFORMS.map((p) => [packageName(p), version])),
  };
  const man = share && path.join(share, "man/man1/toolledger.1");
  if (man && fs.existsSync(man)) {
    fs.mkdirSync(path.join(dir, "man"), { recursive: true });
    fs.copyFileSync(man, path.join(dir, "man", "toolledger.1"));
    files.push("man/toolledger.1");
    manifest.man = ["./man/toolledger.1"];
  }
  writeJson(path.join(dir, "package.json"), manifest);
  return dir;
}

function writePlatform(out, version, platform, binary, share) {
  checkBinary(platform, binary);
  const dir = path.join(out, `cli-${platform.name}`);
  fs.rmSync(dir, { recursive: true, force: true });
  fs.mkdirSync(path.join(dir, "bin"), { recursive: true });
  const exe = platform.os === "win32" ? ".exe" : "";
  const target = path.join(dir, "bin", `toolledger${exe}`);
  fs.copyFileSync(binary, target);
  fs.chmodSync(target, 0o755);
  const files = [`bin/toolledger${exe}`, "README.md", "LICENSE-MIT", "LICENSE-APACHE"];
  const shipped = [];
  for (const rel of SHARE_FILES) {
    const source = share && path.join(share, rel);
    if (source && fs.existsSync(source)) {
      fs.mkdirSync(path.join(dir, "share", path.dirname(rel)), { recursive: true });
      fs.copyFileSync(source, path.join(dir, "share", rel));
      files.push(`share/${rel}`);
      shipped.push(`share/${rel}`);
    }
  }
  copyLicenses(dir);
  fs.writeFileSync(
    path.join(dir, "README.md"),
    `# ${packageName(platform)}\n\n` +
      `The \`toolledger\` binary for ${platform.name} (Rust target \`${platform.target}\`). ` +
      "Install the package `toolledger` instead (`npx -y toolledger ...` or `npm install -g toolledger`): " +
      "it depends on this one and runs the binary in it.\n\n" +
      (shipped.length ? `Also here: ${shipped.map((f) => `\`${f}\``).join(", ")}.\n\n` : "") +
      `See ${REPOSITORY_URL}/blob/main/docs/install.md.\n`,
  );
  const manifest = {
    name: packageName(platform),
    ...common(version),
    description: `The toolledger binary for ${platform.name}.`,
    os: [platform.os],
    cpu: [platform.cpu],
    ...(platform.libc ? { libc: [platform.libc] } : {}),
    files,
    preferUnplugged: true,
  };
  writeJson(path.join(dir, "package.json"), manifest);
  return dir;
}

function main(argv) {
  let out = path.join(REPO, "target", "dist", "npm");
  let share = null;
  const binaries = new Map();
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    const value = () => {
      if (i + 1 >= argv.length) die(`${arg} needs a value`);
      return argv[++i];
    };
    if (arg === "--list") {
      for (const p of PLATFORMS) console.log(`${p.name}\t${packageName(p)}\t${p.target}`);
      return;
    } else if (arg === "--out") out = path.resolve(value());
    else if (arg === "--share") share = path.resolve(value());
    else if (arg === "--binary") {
      const [name, file] = value().split(/=(.*)/s);
      const platform = PLATFORMS.find((p) => p.name === name);
      if (!platform || !file) die(`--binary wants PLATFORM=PATH with PLATFORM one of ${PLATFORMS.map((p) => p.name).join(", ")}`);
      if (!fs.existsSync(file)) die(`${file}: no such file`);
      binaries.set(name, path.resolve(file));
    } else die(`unknown argument ${arg}`);
  }
  const version = workspaceVersion();
  fs.mkdirSync(out, { recursive: true });
  console.log(`${writeLauncher(out, version, share)}\ttoolledger@${version}`);
  for (const platform of PLATFORMS) {
    const binary = binaries.get(platform.name);
    if (binary) {
      console.log(`${writePlatform(out, version, platform, binary, share)}\t${packageName(platform)}@${version}`);
    } else {
      process.stderr.write(`generate.mjs: ${packageName(platform)}@${version} declared, not built here (no --binary ${platform.name}=...)\n`);
    }
  }
}

main(process.argv.slice(2));
