#!/usr/bin/env bash
# One name, one meaning (issue 26, point 5): the renames of that change as mechanical
# rewrites, so that they can be applied again to a tree that gained new uses of the old
# names (a branch merged after them).
#
#   scripts/migrate-names.sh [CHECKOUT]     (default: the checkout this script is in)
#
# Idempotent: a second run changes nothing. It rewrites `*.rs` files under runtime/, src/,
# tests/, compiler/ and bench/, and moves three files with `git mv`. It does not move code:
# the definitions it renames were moved by hand once (`Layout` and friends into
# `runtime/src/layout.rs`, `write_atomic` and friends into `runtime/src/durable.rs`, the
# two `Kind`s of a standard run or a MapReduce job into `layout::RunKind`). Run
# `cargo fmt --all` afterwards: imports split off a group land on a line of their own.
#
# | old                                  | new                                  |
# | ------------------------------------ | ------------------------------------ |
# | `backend::Executor` (enum)           | `backend::AgentHost`                 |
# | `executor::Kind`                     | `executor::RequestKind`              |
# | `message::Phase`                     | `message::StepList`                  |
# | `jobstore::Phase`                    | `jobstore::JobPhase`                 |
# | `runs::Kind`, `session::Kind`        | `layout::RunKind` (`Session` → `Run`) |
# | `sequence::RunEvent`, `RunAction`    | `SequenceEvent`, `SequenceAction`    |
# | `message::Bug::UnexpectedRunEvent`   | `Bug::UnexpectedSequenceEvent`       |
# | `worktree::worktrees_dir(&layout)`, `logs::dir(&layout, id)` | `layout.worktrees_dir()`, `layout.logs_dir(id)` |
# | `merge_journal::{FILE, KEPT_FILE}`   | `layout::{MERGES, KEPT_WORKTREES}`   |
# | `store::{Layout, namespace, top_level, is_id}` | `layout::…`                |
# | `store::{write_atomic, private_dir, PRIVATE_FILE, PRIVATE_DIR}` | `durable::…` |
# | module `statefs` (`statefs.rs`)      | `durable` (`durable.rs`)             |
# | module `paths` (`paths.rs`)          | `confine` (`confine.rs`)             |
# | `runner/preflight.rs`, `runner::preflight` | `runner/claude_check.rs`, `runner::check_claude` |
# | compiler `scope.rs`'s private `Phase` | `Section`                           |
set -euo pipefail

root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root"

move() {
    if [ -e "$1" ] && [ ! -e "$2" ]; then
        git mv "$1" "$2"
    fi
}
move runtime/src/statefs.rs runtime/src/durable.rs
move runtime/src/paths.rs runtime/src/confine.rs
move runtime/src/runner/preflight.rs runtime/src/runner/claude_check.rs

mapfile -t files < <(git ls-files -- runtime src tests compiler bench | grep '\.rs$' || true)
# Files `git mv` just moved, and new files not yet added, are listed under their new names.
mapfile -t -O "${#files[@]}" files < <(git ls-files --others --exclude-standard -- runtime src tests compiler bench | grep '\.rs$' || true)
[ "${#files[@]}" -gt 0 ] || exit 0

read -r -d '' program <<'PERL' || true
use strict;
use warnings;

# [module the name was in, old name, module it is in now, new name]
my @moves = (
    ['backend',  'Executor',     'backend',  'AgentHost'],
    ['executor', 'Kind',         'executor', 'RequestKind'],
    ['message',  'Phase',        'message',  'StepList'],
    ['jobstore', 'Phase',        'jobstore', 'JobPhase'],
    ['runs',     'Kind',         'layout',   'RunKind'],
    ['session',  'Kind',         'layout',   'RunKind'],
    ['run',      'Kind',         'run',      'RunKind'],   # the binary's re-export
    ['sequence', 'RunEvent',     'sequence', 'SequenceEvent'],
    ['sequence', 'RunAction',    'sequence', 'SequenceAction'],
    ['store',    'Layout',       'layout',   'Layout'],
    ['store',    'namespace',    'layout',   'namespace'],
    ['store',    'top_level',    'layout',   'top_level'],
    ['store',    'is_id',        'layout',   'is_id'],
    ['store',    'write_atomic', 'durable',  'write_atomic'],
    ['store',    'private_dir',  'durable',  'private_dir'],
    ['store',    'PRIVATE_FILE', 'durable',  'PRIVATE_FILE'],
    ['store',    'PRIVATE_DIR',  'durable',  'PRIVATE_DIR'],
);

# Files that define a renamed name, where it is used bare.
my %defines = (
    'runtime/src/backend/mod.rs' => [['Executor', 'AgentHost']],
    'runtime/src/executor.rs'    => [['Kind', 'RequestKind']],
    'runtime/src/message.rs'     => [['Phase', 'StepList']],
    'runtime/src/jobstore.rs'    => [['Phase', 'JobPhase']],
    'runtime/src/sequence.rs'    => [['RunEvent', 'SequenceEvent'], ['RunAction', 'SequenceAction']],
    'compiler/src/scope.rs'      => [['Phase', 'Section']],
);

my $file = $ARGV;
my $here = $file =~ m{^runtime/src/} ? 'crate' : 'prodigy_runtime';
my $prefix = qr/(?:crate|prodigy_runtime)/;
our %bare = ();    # old name => new name, used bare in this file
our $regrouped = 0;

# Splits `use PREFIX::MODULE::{...};` groups: a moved item gets a `use` of its own.
sub regroup {
    my ($indent, $vis, $pfx, $module, $items, $from, $old, $to, $new) = @_;
    my @keep;
    my @moved;
    for my $item (map { s/^\s+|\s+$//gr } split /,/, $items) {
        next if $item eq '';
        if ($item =~ /^\Q$old\E(\s+as\s+\w+)?$/ && $from eq $to) {
            # Renamed where it is: it stays in its group.
            my $as = $1 // '';
            push @keep, "$new$as";
            $main::bare{$old} = $new if $as eq '' && $old ne $new;
            $main::regrouped = 1;
        } elsif ($item =~ /^\Q$old\E(\s+as\s+\w+)?$/) {
            my $as = $1 // '';
            push @moved, "$indent${vis}use $pfx$to\::$new$as;";
            $main::bare{$old} = $new if $as eq '' && $old ne $new;
        } else {
            push @keep, $item;
        }
    }
    return undef unless @moved || $main::regrouped;
    $main::regrouped = 0;
    my @out;
    if (@keep == 1 && $keep[0] eq 'self') {
        push @out, "$indent${vis}use $pfx$module;";
    } elsif (@keep) {
        push @out, "$indent${vis}use $pfx$module\::{" . join(', ', @keep) . '};';
    }
    return join("\n", @out, @moved);
}

for my $m (@moves) {
    my ($from, $old, $to, $new) = @$m;
    # use PREFIX::from::{..., old, ...};
    s{^([ \t]*)((?:pub(?:\([a-z]+\))?\s+)?)use\s+($prefix\::)\Q$from\E::\{([^{}]*)\};}{
        regroup($1, $2, $3, $from, $4, $from, $old, $to, $new)
            // "$1$2use $3$from\::{$4};"
    }gme;
    # use PREFIX::from::old;  (bare from then on)
    if (/^\s*(?:pub(?:\([a-z]+\))?\s+)?use\s+$prefix\::\Q$from\E::\Q$old\E;/m) {
        $bare{$old} = $new if $old ne $new;
    }
    # PREFIX::from::old anywhere
    s{\b($prefix\::)\Q$from\E::\Q$old\E\b}{$1$to\::$new}g;
    # from::old, the module named relatively (after `use PREFIX::from;`)
    if ($from eq $to) {
        s{(?<![:\w])\Q$from\E::\Q$old\E\b}{$from\::$new}g;
    } else {
        s{(?<![:\w])\Q$from\E::\Q$old\E\b}{$here\::$to\::$new}g;
    }
}

# Files whose definition of a name moved to another module, where it is used bare.
my %defined = (
    'runtime/src/runs.rs'        => [['Kind', 'RunKind', 'layout']],
    'runtime/src/session/mod.rs' => [['Kind', 'RunKind', 'layout']],
);
for my $triple (@{ $defined{$file} // [] }) {
    my ($old, $new, $module) = @$triple;
    s{(?<![:\w])\Q$old\E\b}{$new}g;
    if (/(?<![:\w])\Q$new\E\b/ && !/^\s*use\s+crate::\Q$module\E::(?:\Q$new\E|\{[^}]*\b\Q$new\E\b)/m) {
        s{^(use [^;]+;\n)}{$1use crate::$module\::$new;\n}m;
    }
}
for my $pair (@{ $defines{$file} // [] }) {
    my ($old, $new) = @$pair;
    $bare{$old} = $new if /\b(?:enum|struct|trait|type)\s+\Q$old\E\b/;
}
for my $old (sort keys %bare) {
    my $new = $bare{$old};
    s{(?<![:\w])\Q$old\E\b}{$new}g;
}
s{\bRunKind::Session\b}{RunKind::Run}g;
s{\bUnexpectedRunEvent\b}{UnexpectedSequenceEvent}g;

# Path helpers that moved into `Layout`.
s{(?<!fn )(?<![.\w])(?:(?:crate|prodigy_runtime|super)::)?(?:worktree::)?worktrees_dir\(&?(?!self\b)(\w+)\)}{$1.worktrees_dir()}g;
s{(?<![.\w])(?:(?:crate|prodigy_runtime)::)?logs::dir\(&?([\w.]+), }{$1.logs_dir(}g;
s{\b((?:crate|prodigy_runtime)::)merge_journal::FILE\b}{$1layout::MERGES}g;
s{\b((?:crate|prodigy_runtime)::)merge_journal::KEPT_FILE\b}{$1layout::KEPT_WORKTREES}g;

# Modules renamed.
s{\b($prefix\::)statefs\b}{$1durable}g;
s{(?<![:\w])statefs::}{durable::}g;
s{\b($prefix\::)paths\b}{$1confine}g;
if ($file eq 'runtime/src/lib.rs') {
    s{^(\s*pub mod )statefs;}{$1durable;}m;
    s{^(\s*pub mod )paths;}{$1confine;}m;
}

# The Claude check before a run: `runner::preflight` beside `session::preflight`.
if ($file eq 'runtime/src/runner/mod.rs') {
    s{^(\s*)mod preflight;}{$1mod claude_check;}m;
    s{\bpreflight::\{needs_claude, preflight\}}{claude_check::{check_claude, needs_claude}}g;
    s{\bpreflight::}{claude_check::}g;
}
if ($file eq 'runtime/src/runner/claude_check.rs') {
    s{\bpub fn preflight\(}{pub fn check_claude(}g;
}
s{\bcrate::runner::preflight\b}{crate::runner::check_claude}g;
PERL

perl -0777 -i -ne "$program; print" "${files[@]}"
