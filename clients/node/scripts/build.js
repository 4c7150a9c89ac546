#!/usr/bin/env node
// Builds the native module from source: `cargo build` of the crate in this folder (or of its
// copy in rust/, in a packed tarball: see scripts/vendor.js), then
// copies the library to native/redsem.node (what index.js loads).
//
//   node scripts/build.js [--release] [--profile NAME]
//
// Cargo must be on PATH. The target directory is Cargo's: the workspace's target/, or
// $CARGO_TARGET_DIR (set it to one persistent folder so that re-installs reuse the build).
// `npm install` runs this with --release (the package's "install" script).
'use strict';

const { spawnSync } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');

const here = path.resolve(__dirname, '..');
const args = process.argv.slice(2);
// from a packed tarball: the Rust sources vendored by scripts/vendor.js; in the repository:
// this folder's crate, a member of the repository's workspace
const vendored = path.join(here, 'rust', 'clients', 'node', 'Cargo.toml');
const manifest = fs.existsSync(vendored) ? vendored : path.join(here, 'Cargo.toml');
const cargoArgs = ['build', '--lib', '--manifest-path', manifest,
  '--message-format=json-render-diagnostics'];
for (let i = 0; i < args.length; i++) {
  if (args[i] === '--release') cargoArgs.push('--release');
  else if (args[i] === '--profile') cargoArgs.push('--profile', args[++i]);
  else {
    console.error(`build.js: unknown argument ${args[i]}`);
    process.exit(2);
  }
}

const cargo = process.env.CARGO || 'cargo';
const run = spawnSync(cargo, cargoArgs, {
  cwd: here,
  stdio: ['ignore', 'pipe', 'inherit'],
  maxBuffer: 256 * 1024 * 1024,
});
if (run.error) {
  console.error(`build.js: cannot run ${cargo} (${run.error.message}): the redsem package is ` +
    'built from source at install and needs a Rust toolchain (https://rustup.rs) on PATH');
  process.exit(1);
}
if (run.status !== 0) {
  console.error(`build.js: cargo build failed (exit ${run.status})`);
  process.exit(run.status || 1);
}

let library;
for (const line of run.stdout.toString().split('\n')) {
  if (!line.startsWith('{')) continue;
  const msg = JSON.parse(line);
  if (msg.reason === 'compiler-artifact' && msg.target.name === 'redsem_node'
    && msg.target.kind.includes('cdylib')) {
    library = msg.filenames.find((f) => /\.(so|dylib|dll)$/.test(f));
  }
}
if (!library) {
  console.error('build.js: cargo did not report the redsem_node library');
  process.exit(1);
}
const out = path.join(here, 'native');
fs.mkdirSync(out, { recursive: true });
// copy to a temporary name and rename: a process that has the old module loaded keeps it
const tmp = path.join(out, `redsem.node.${process.pid}`);
fs.copyFileSync(library, tmp);
fs.renameSync(tmp, path.join(out, 'redsem.node'));
console.error(`build.js: ${path.relative(process.cwd(), path.join(out, 'redsem.node')) || 'native/redsem.node'} <- ${library}`);
