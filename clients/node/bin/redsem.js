#!/usr/bin/env node
// `npx redsem ...`: the redsem command line (crates/redsem-cli), run in this process by the
// native module. It blocks this thread until the command is done, then exits with its status.
'use strict';

const { cliMain } = require('..');

process.exitCode = cliMain(process.argv.slice(2));
process.exit();
