#!/usr/bin/env node
// Makes the package self-contained for `npm pack` (its "prepack" script): copies the Rust
// sources it builds from into rust/, with the repository's layout, so that the tarball
// builds on a machine without the repository:
//
//   rust/Cargo.toml          the workspace manifest, members limited to what the build needs
//   rust/Cargo.lock          the repository's lock file (same dependency versions)
//   rust/crates/redsem, rust/crates/redsem-cli, rust/crates/test-support (a dev-dependency
//                            of both: Cargo reads its manifest to resolve the workspace)
//   rust/clients/node/       this crate: Cargo.toml, build.rs, src/
//
// scripts/build.js builds rust/clients/node/Cargo.toml when it exists. `--clean` (the
// "postpack" script) removes rust/.
'use strict';

const fs = require('node:fs');
const path = require('node:path');

const here = path.resolve(__dirname, '..');
const repo = path.resolve(here, '../..');
const out = path.join(here, 'rust');

fs.rmSync(out, { recursive: true, force: true });
if (process.argv.includes('--clean')) process.exit(0);

const crates = ['crates/redsem', 'crates/redsem-cli', 'crates/test-support'];
const skip = new Set(['target', 'node_modules', 'native', 'rust', '.cache']);
function copy(from, to) {
  fs.mkdirSync(to, { recursive: true });
  for (const entry of fs.readdirSync(from, { withFileTypes: true })) {
    if (skip.has(entry.name)) continue;
    const src = path.join(from, entry.name);
    const dst = path.join(to, entry.name);
    if (entry.isDirectory()) copy(src, dst);
    else if (entry.isFile()) fs.copyFileSync(src, dst);
  }
}
for (const c of crates) copy(path.join(repo, c), path.join(out, c));
const node = path.join(out, 'clients/node');
fs.mkdirSync(node, { recursive: true });
for (const f of ['Cargo.toml', 'build.rs']) fs.copyFileSync(path.join(here, f), path.join(node, f));
copy(path.join(here, 'src'), path.join(node, 'src'));
fs.copyFileSync(path.join(repo, 'Cargo.lock'), path.join(out, 'Cargo.lock'));

const manifest = fs.readFileSync(path.join(repo, 'Cargo.toml'), 'utf8');
const members = /^members = \[.*\]$/m;
if (!members.test(manifest)) {
  console.error('vendor.js: no `members = [...]` line in the workspace Cargo.toml');
  process.exit(1);
}
const list = [...crates, 'clients/node'].map((m) => JSON.stringify(m)).join(', ');
fs.writeFileSync(path.join(out, 'Cargo.toml'), manifest
  .replace(members, `members = [${list}]`)
  .replace(/^default-members = \[.*\]\n/m, ''));
console.error(`vendor.js: ${path.relative(process.cwd(), out) || 'rust'}/ has the Rust sources (${list})`);
