#!/usr/bin/env bash
# Are the workspace's crates ready for crates.io? Packages every crate as `cargo publish` would
# upload it, and checks what is in the packages and that their sources compile.
#
# Usage: bash .ci/package.sh [--full] [extra `cargo package` flags, e.g. --allow-dirty]
#
# Default (what CI runs; a few minutes on 2 cores from a cold target/package/check):
#
# 1. `cargo package --workspace --no-verify --locked` writes target/package/NAME-0.1.0.crate
#    for every member, in dependency order. This proves that every manifest is publishable as
#    written: no path-only dependency (each internal one has a version), the metadata cargo
#    requires (description, license), a README that exists, and that each package's
#    dependencies resolve from its packaged manifest, with the internal ones taken from the
#    other packages of this run (a local overlay of crates.io, as `cargo publish --workspace`
#    does).
# 2. The file list of every .crate: Cargo.toml, README.md, src/lib.rs or src/main.rs, and
#    LICENSE-MIT and LICENSE-APACHE as regular files identical to the root's (the crates hold
#    symlinks, which cargo follows); the packaged manifests name the repository, the docs.rs
#    page and the readme.
# 3. The unpacked .crate files are compiled with `cargo check --workspace`: all of them in one
#    throwaway workspace (target/package/check), each internal dependency patched to its
#    unpacked package, with the workspace's Cargo.lock copied in so every third-party version
#    is the one CI tests; the script fails if any version would change. This proves that the
#    packaged sources are complete (every module, include_str! file and build script is in
#    the package) and type-check, with the features the published dependents ask for.
#
# What the default does not prove:
# - code generation and linking (it is `cargo check`, not `cargo build`);
# - that each crate compiles alone with only its own features: the packages are checked
#   together, as `cargo install toolledger-cli` resolves them, so a crate's feature
#   combination that only a library user would pick (say toolledger-reference without `clap`)
#   is not checked here (the workspace's own clippy and test runs cover the members);
# - that the packages' tests, examples and benches compile from the package (cargo package
#   does not check them either; most of them need toolledger-testkit, a dev-dependency that
#   every published manifest leaves out to avoid a publish cycle, see the root Cargo.toml);
# - what only crates.io decides at upload: that the names are free, the category slugs and
#   keyword rules, the size limit.
#
# `--full` runs `cargo package --workspace --locked` instead, with cargo's own verification:
# every package built (not checked) alone, in dependency order. That proves the first two
# points above too, but it took 24m39s (14m17s of CPU) on the shared 2-core machine, far more
# than CI's budget, so it is for a release, not for every CI run.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never

full=0
if [ "${1:-}" = "--full" ]; then
  full=1
  shift
fi

started=$(date +%s)
since() { echo "$(( $(date +%s) - $1 ))s"; }

if [ "$full" = 1 ]; then
  echo "== cargo package --workspace --locked (verified: every package built from its .crate)"
  cargo package --workspace --locked "$@"
  echo "== package.sh --full: $(since "$started")"
  exit 0
fi

echo "== cargo package --workspace --no-verify --locked"
step=$(date +%s)
cargo package --workspace --no-verify --locked "$@"
echo "   $(since "$step")"

# name version, one member a line.
members=$(cargo metadata --no-deps --locked --format-version 1 | python3 -c '
import json, sys
for p in json.load(sys.stdin)["packages"]:
    print(p["name"], p["version"])
')

echo "== contents of every .crate"
step=$(date +%s)
while read -r name version; do
  crate="target/package/$name-$version.crate"
  listing=$(tar -tzvf "$crate")
  files=$(tar -tzf "$crate" | sed "s|^$name-$version/||")
  for f in Cargo.toml README.md LICENSE-MIT LICENSE-APACHE; do
    grep -qx "$f" <<<"$files" || { echo "$crate has no $f" >&2; exit 1; }
  done
  grep -qx -e src/lib.rs -e src/main.rs <<<"$files" || { echo "$crate has no src/" >&2; exit 1; }
  for f in LICENSE-MIT LICENSE-APACHE; do
    grep -q "^-.* $name-$version/$f\$" <<<"$listing" \
      || { echo "$crate: $f is not a regular file" >&2; exit 1; }
    tar -xzOf "$crate" "$name-$version/$f" | cmp -s - "$f" \
      || { echo "$crate: $f differs from the root's" >&2; exit 1; }
  done
  manifest=$(tar -xzOf "$crate" "$name-$version/Cargo.toml")
  for key in 'repository = "https://github.com/toolledger/toolledger"' \
             "documentation = \"https://docs.rs/$name\"" 'readme = "README.md"'; do
    grep -qF "$key" <<<"$manifest" || { echo "$crate: manifest lacks $key" >&2; exit 1; }
  done
  echo "   $name $version: $(wc -l <<<"$files") files"
done <<<"$members"
echo "   $(since "$step")"

echo "== cargo check of the unpacked packages"
step=$(date +%s)
check=target/package/check
rm -rf "$check/src" && mkdir -p "$check/src"
{
  echo '# Generated by .ci/package.sh: the unpacked .crate files as one workspace.'
  echo '[workspace]'
  echo 'resolver = "2"'
  echo 'members = ['
  while read -r name version; do echo "    \"src/$name-$version\","; done <<<"$members"
  echo ']'
  echo '[patch.crates-io]'
  while read -r name version; do
    echo "$name = { path = \"src/$name-$version\" }"
  done <<<"$members"
  # The workspace's own profiles, so that the dependencies' check artifacts in target/ (left
  # by clippy in CI) are the ones this check needs.
  sed -n '/^\[profile\./,$p' Cargo.toml
} >"$check/Cargo.toml"
while read -r name version; do
  # -m: the files get the time of extraction, not the fixed time cargo writes into every
  # .crate, so a check target kept from an earlier run cannot take new sources for old ones.
  tar -xzmf "target/package/$name-$version.crate" -C "$check/src"
done <<<"$members"
cp Cargo.lock "$check/Cargo.lock"
# Not --locked: a dev-dependency left out of a published manifest drops its edge from the lock
# file. Every package's version must stay as it is, which is checked below.
# The repository's target/ is shared: the unpacked members are other packages (other paths)
# than the workspace's, and the third-party crates they share are not checked twice.
CARGO_TARGET_DIR="$PWD/target" cargo check --workspace --manifest-path "$check/Cargo.toml"
python3 - Cargo.lock "$check/Cargo.lock" <<'EOF'
import sys, tomllib
def versions(path):
    with open(path, "rb") as f:
        return {(p["name"], p["version"], p.get("source")) for p in tomllib.load(f)["package"]}
ours, packaged = versions(sys.argv[1]), versions(sys.argv[2])
if ours != packaged:
    sys.exit("the packages resolve other versions than Cargo.lock:\n  only in Cargo.lock: %s\n"
             "  only in the packages' lock: %s" % (sorted(ours - packaged), sorted(packaged - ours)))
print("   every dependency at its Cargo.lock version")
EOF
echo "   $(since "$step")"

echo "== package.sh: $(since "$started")"
