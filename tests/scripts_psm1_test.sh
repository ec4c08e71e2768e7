#!/bin/sh
# Static check of scripts/qinfer.psm1 where no PowerShell is installed: a small
# PowerShell lexer (strings, here-strings, comments, backtick escapes) checks
# that every bracket closes in order and that no string is left open, and the
# module defines and exports Invoke-Qinfer with the documented parameters.
# Where pwsh exists, its real parser checks the file too.
set -u
here=$(cd "$(dirname "$0")" && pwd)
psm1=${PSM1:-$here/../scripts/qinfer.psm1}
if command -v pwsh >/dev/null 2>&1; then
    pwsh -NoProfile -Command "\$e = \$null; [void][System.Management.Automation.Language.Parser]::ParseFile('$psm1', [ref]\$null, [ref]\$e); if (\$e.Count) { \$e; exit 1 }" || exit 1
    echo "ok   pwsh parses qinfer.psm1"
fi
if ! command -v python3 >/dev/null 2>&1; then
    echo "skip: python3 not found (needed for the static PowerShell check)"
    exit 0
fi
python3 - "$psm1" <<'EOF'
import re, sys

src = open(sys.argv[1], encoding="utf-8").read()
pairs = {")": "(", "}": "{", "]": "["}
stack, i, line = [], 0, 1
def fail(msg):
    print(f"FAIL qinfer.psm1 line {line}: {msg}")
    sys.exit(1)
while i < len(src):
    c = src[i]
    if c == "\n":
        line += 1
    if src.startswith("<#", i):
        j = src.find("#>", i + 2)
        if j < 0: fail("block comment never closed")
        line += src.count("\n", i, j); i = j + 2; continue
    if c == "#":
        j = src.find("\n", i)
        i = len(src) if j < 0 else j
        continue
    if src.startswith("@'", i) or src.startswith('@"', i):
        end = "\n" + src[i + 1] + "@"
        j = src.find(end, i + 2)
        if j < 0: fail("here-string never closed")
        line += src.count("\n", i, j); i = j + 3; continue
    if c == "'":
        j = i + 1
        while True:
            j = src.find("'", j)
            if j < 0: fail("single-quoted string never closed")
            if src.startswith("''", j): j += 2; continue
            break
        line += src.count("\n", i, j); i = j + 1; continue
    if c == '"':
        j = i + 1
        while j < len(src) and src[j] != '"':
            j += 2 if src[j] == "`" else 1
        if j >= len(src): fail("double-quoted string never closed")
        line += src.count("\n", i, j); i = j + 1; continue
    if c == "`":
        i += 2; continue
    if c in "({[":
        stack.append((c, line))
    elif c in ")}]":
        if not stack or stack[-1][0] != pairs[c]:
            fail(f"'{c}' does not close " + (f"'{stack[-1][0]}' of line {stack[-1][1]}" if stack else "anything"))
        stack.pop()
    i += 1
if stack:
    line = stack[-1][1]
    fail(f"'{stack[-1][0]}' never closed")
print("ok   brackets and strings of qinfer.psm1 balance")
if not re.search(r"^function Invoke-Qinfer \{", src, re.M): fail("no 'function Invoke-Qinfer {'")
if not re.search(r"^Export-ModuleMember -Function Invoke-Qinfer\s*$", src, re.M): fail("Invoke-Qinfer is not exported")
params = re.findall(r"\[[A-Za-z\[\]]+\] \$(\w+)", src.split("begin {")[0])
want = ["Question", "InputObject", "Model", "Url", "System", "MaxTokens", "Temperature", "Think", "Qinfer"]
if params != want: fail(f"parameters {params}, expected {want}")
print("ok   Invoke-Qinfer is defined and exported with parameters " + ", ".join(want))
EOF
