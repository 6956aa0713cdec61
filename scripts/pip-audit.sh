#!/usr/bin/env bash
# pip-audit of the installed environment (.venv) against published advisories (issue 16), called
# by scripts/test.sh after lint. Tries PyPI's advisory data first, then OSV's API.
#
# Exit status: 1 when a dependency has a known vulnerability that scripts/pip-audit-ignore.txt
# does not list (one ID per line, each with its reason); 0 otherwise — including when no
# vulnerability service answered for any dependency, which it says in one line: CI reaches the
# PyPI package index but, on the build machines seen so far, neither PyPI's per-version JSON
# (/pypi/<name>/<version>/json answers 404 there) nor api.osv.dev (not resolvable), so an
# unreachable service is reported, never a failure (it must not make CI flaky).
# docs/scaling.md ("pip-audit") has what was measured and the air-gapped alternative.
set -uo pipefail
cd "$(dirname "$0")/.."

audit=.venv/bin/pip-audit
if [ ! -x "$audit" ]; then
  echo "pip-audit: not installed in .venv (the dev extra): not audited"
  exit 0
fi
ignore=()
if [ -f scripts/pip-audit-ignore.txt ]; then
  while read -r id _; do
    case "$id" in "" | "#"*) continue ;; esac
    ignore+=(--ignore-vuln "$id")
  done <scripts/pip-audit-ignore.txt
fi
out=$(mktemp)
err=$(mktemp)
trap 'rm -f "$out" "$err"' EXIT
for service in pypi osv; do
  timeout 600 "$audit" --vulnerability-service "$service" --skip-editable --progress-spinner off \
    --timeout 10 --format json --output "$out" "${ignore[@]}" >/dev/null 2>"$err"
  status=$?
  # What the service answered for: audited dependencies, vulnerable ones, and skips.
  summary=$(.venv/bin/python - "$out" 2>>"$err" <<'EOF'
import json
import sys

try:
    with open(sys.argv[1]) as fh:
        report = json.load(fh)
except (OSError, ValueError):
    print("0 0 0")
    sys.exit()
deps = report.get("dependencies", [])
audited = [d for d in deps if "skip_reason" not in d]
vulnerable = [d for d in audited if d.get("vulns")]
for d in vulnerable:
    for v in d["vulns"]:
        fixed = ", ".join(v.get("fix_versions") or []) or "no fix yet"
        print(f"VULN {d['name']} {d['version']}: {v['id']} (fixed in: {fixed})", file=sys.stderr)
skips = [d["skip_reason"] for d in deps if "skip_reason" in d]
if skips and not audited:
    print(f"SKIP e.g. {skips[0]}", file=sys.stderr)
print(len(audited), len(vulnerable), len(deps) - len(audited))
EOF
  )
  read -r audited vulnerable skipped <<<"$summary"
  if [ "${audited:-0}" -gt 0 ]; then
    echo "pip-audit ($service): $audited dependencies audited, $vulnerable vulnerable, $skipped skipped"
    if [ "${vulnerable:-0}" -gt 0 ]; then
      grep -h "^VULN" "$err" >&2 || true
      echo "pip-audit: known vulnerabilities (upgrade, or list the ID in scripts/pip-audit-ignore.txt with why)" >&2
      exit 1
    fi
    exit 0
  fi
  why=$(grep -v "^VULN" "$err" | grep -Eo "(NameResolutionError|ConnectionError|timed out)" | sort -u | paste -sd, -)
  [ -n "$why" ] || why=$(grep -h "^SKIP" "$err" | head -1 | cut -c6-200)
  echo "pip-audit ($service): no dependency could be audited (exit $status; ${why:-no answer}): the service is unreachable from here"
done
echo "pip-audit: no vulnerability service reachable from this machine: NOT audited (continuing)"
exit 0
