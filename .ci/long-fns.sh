#!/usr/bin/env bash
# Lists functions longer than a limit (default 100 lines, signature to closing brace) in the
# src/ of the crates on the I/O path, and fails if there is any: a long function there is to
# be split into named steps. Counts on rustfmt'd code: a function ends at the first line that
# is its own indentation followed by `}`. Test modules (`#[cfg(test)]` then `mod` at the start
# of a line, up to the next `}` there) are not the I/O path and are left out.
#   .ci/long-fns.sh [LIMIT] [CRATE...]     (default: qpath-host qpath-target uring nvme blk)
set -euo pipefail
cd "$(dirname "$0")/.."
limit=${1:-100}
shift || true
crates=("$@")
[ ${#crates[@]} -gt 0 ] || crates=(qpath-host qpath-target uring nvme blk)
files=()
for c in "${crates[@]}"; do
    while IFS= read -r f; do files+=("$f"); done < <(find "crates/$c/src" -name '*.rs' | sort)
done
awk -v limit="$limit" '
    FNR == 1 { depth = 0; in_test = 0; cfg_test = 0 }
    in_test { if ($0 == "}") in_test = 0; next }
    cfg_test { cfg_test = 0; if ($0 ~ /^(pub(\([a-z]+\))? )?mod /) { in_test = 1; next } }
    /^#\[cfg\(test\)\]/ { cfg_test = 1; next }
    # A new item: `fn name` after optional visibility and qualifiers, at any indentation.
    match($0, /^[ \t]*((pub(\([a-z:]+\))?|const|async|unsafe|extern "[A-Za-z]+"|default) +)*fn [A-Za-z_][A-Za-z0-9_]*/) {
        indent = $0; sub(/[^ \t].*$/, "", indent)
        name = $0; sub(/^.*fn /, "", name); sub(/[^A-Za-z0-9_].*$/, "", name)
        depth++
        st_indent[depth] = indent; st_name[depth] = name; st_start[depth] = FNR; st_sig[depth] = 1
    }
    depth > 0 && st_sig[depth] {
        # The signature ends at the first line ending in `{` (a body) or `;` (no body).
        if ($0 ~ /;[ \t]*$/) { depth--; next }
        if ($0 ~ /\}[ \t]*$/ && FNR == st_start[depth]) { depth--; next }   # one-line body
        if ($0 ~ /\{[ \t]*$/) st_sig[depth] = 0
        next
    }
    depth > 0 && $0 == st_indent[depth] "}" {
        n = FNR - st_start[depth] + 1
        if (n > limit) { printf "%s:%d: fn %s is %d lines (limit %d)\n", FILENAME, st_start[depth], st_name[depth], n, limit; bad++ }
        depth--
    }
    END { exit bad > 0 ? 1 : 0 }
' "${files[@]}"
