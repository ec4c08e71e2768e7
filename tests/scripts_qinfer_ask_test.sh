#!/bin/sh
# Tests scripts/qinfer-ask: the question reaches qinfer byte for byte, only the
# answer comes back (thinking stripped), server mode builds a valid request and
# unescapes the JSON answer, and errors are one clear line with exit status 1.
# A stand-in `qinfer` and `curl` record what they were given; one last case
# runs the real binary on a reference model.
#
#   sh tests/scripts_qinfer_ask_test.sh [path/to/qinfer] [reference dir]
set -u
here=$(cd "$(dirname "$0")" && pwd)
ask="$here/../scripts/qinfer-ask"
qinfer_bin=${1:-$here/../build/qinfer}
ref=${2:-${QINFER_REFERENCE_DIR:-$here/../../shared/reference}}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/qinfer-ask-test.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
failures=0
check() {  # check NAME EXPECTED ACTUAL
    if [ "$2" = "$3" ]; then
        echo "ok   $1"
    else
        echo "FAIL $1"
        printf '  expected: [%s]\n  actual:   [%s]\n' "$2" "$3"
        failures=$((failures + 1))
    fi
}

# ---------------------------------------------------------------- local mode, stand-in qinfer
cat >"$tmp/fake-qinfer" <<'EOF'
#!/bin/sh
# Records its arguments (one per line) and the -f file, answers with thinking.
printf '%s\n' "$@" >"$FAKE_DIR/args.txt"
while [ $# -gt 0 ]; do
    if [ "$1" = "-f" ]; then cp "$2" "$FAKE_DIR/question.txt"; fi
    shift
done
printf 'timings 1 ms\n' >&2
printf '<think>\nplan the answer\n</think>\n\nThe answer is "42" \\o/ 你好.\n'
EOF
chmod +x "$tmp/fake-qinfer"
export FAKE_DIR="$tmp"
question='Was ist 6×7? 请回答 "quoted" back\slash $HOME `cmd` *'

out=$(QINFER="$tmp/fake-qinfer" sh "$ask" -m model.gguf -n 16 -t 0 -s "Be brief." "$question")
check "local: answer only, thinking stripped" 'The answer is "42" \o/ 你好.' "$out"
check "local: question reaches qinfer byte for byte" "$question" "$(cat "$tmp/question.txt")"
check "local: qinfer arguments" "run -m model.gguf --chat -f $(sed -n 6p "$tmp/args.txt") --system-prompt Be brief. -n 16 --temp 0 --no-think" \
    "$(tr '\n' ' ' <"$tmp/args.txt" | sed 's/ $//')"

out=$(printf 'line one\nline two\n' | QINFER="$tmp/fake-qinfer" sh "$ask" -m model.gguf -i "Summarize:")
check "local: -i appends standard input" "$(printf 'Summarize:\n\nline one\nline two\n'; echo x)" "$(cat "$tmp/question.txt"; echo x)"
out=$(printf '从标准输入提问' | QINFER="$tmp/fake-qinfer" sh "$ask" -m model.gguf -T)
check "local: question from standard input" '从标准输入提问' "$(cat "$tmp/question.txt")"
check "local: -T keeps thinking" "$(printf '<think>\nplan the answer\n</think>\n\nThe answer is "42" \\o/ 你好.')" "$out"
grep -q -- '--no-think' "$tmp/args.txt" && check "local: -T drops --no-think" "absent" "present"

# ---------------------------------------------------------------- errors
err=$(QINFER_MODEL= QINFER_URL= sh "$ask" "question" 2>&1 >/dev/null); rc=$?
check "error: no model" "1 qinfer-ask: give a model (-m FILE or QINFER_MODEL) or a server (-u URL or QINFER_URL)" "$rc $err"
err=$(sh "$ask" -m m.gguf -n abc "q" 2>&1 >/dev/null); rc=$?
check "error: bad -n" "1 qinfer-ask: -n needs a whole number, got 'abc'" "$rc $err"
cat >"$tmp/failing-qinfer" <<'EOF'
#!/bin/sh
echo "error: m.gguf: cannot open file: No such file or directory" >&2
exit 1
EOF
chmod +x "$tmp/failing-qinfer"
err=$(QINFER="$tmp/failing-qinfer" sh "$ask" -m m.gguf "q" 2>&1 >/dev/null); rc=$?
check "error: qinfer's message is passed on" "1 error: m.gguf: cannot open file: No such file or directory" "$rc $err"

# ---------------------------------------------------------------- server mode, stand-in curl
mkdir -p "$tmp/bin"
cat >"$tmp/bin/curl" <<'EOF'
#!/bin/sh
# Stand-in curl: keeps the request body and URL, writes $FAKE_RESPONSE to -o, prints $FAKE_STATUS.
out=""
while [ $# -gt 0 ]; do
    case $1 in
        -o) out=$2; shift ;;
        --data-binary) cp "${2#@}" "$FAKE_DIR/request.json"; shift ;;
        -w | -H) shift ;;
        http*) echo "$1" >"$FAKE_DIR/url.txt" ;;
    esac
    shift
done
printf '%s' "$FAKE_RESPONSE" >"$out"
printf '%s' "$FAKE_STATUS"
EOF
chmod +x "$tmp/bin/curl"
export FAKE_STATUS=200
export FAKE_RESPONSE='{"id":"c1","choices":[{"index":0,"message":{"role":"assistant","reasoning_content":"hmm","content":"Bonjour \"x\" \\ \u4f60\u597d \ud83d\ude00\nline2\t\u00e9"},"finish_reason":"stop"}]}'
out=$(PATH="$tmp/bin:$PATH" sh "$ask" -u http://127.0.0.1:8080/ -n 32 -s 'sys "q"' "$question")
check "server: answer unescaped to UTF-8" "$(printf 'Bonjour "x" \\ 你好 😀\nline2\té')" "$out"
check "server: URL" "http://127.0.0.1:8080/v1/chat/completions" "$(cat "$tmp/url.txt")"
expected_request='{"model":"qinfer","stream":false,"messages":[{"role":"system","content":"sys \"q\""},{"role":"user","content":"Was ist 6×7? 请回答 \"quoted\" back\\slash $HOME `cmd` *"}],"max_tokens":32,"chat_template_kwargs":{"enable_thinking":false}}'
check "server: request body" "$expected_request" "$(cat "$tmp/request.json")"
if command -v python3 >/dev/null 2>&1; then
    printf 'tab\there\nnew line \001 end' | PATH="$tmp/bin:$PATH" sh "$ask" -u http://h >/dev/null
    parsed=$(python3 -c 'import json,sys; print(repr(json.load(open(sys.argv[1]))["messages"][0]["content"]))' "$tmp/request.json")
    check "server: control characters are valid JSON" "'tab\\there\\nnew line \\x01 end'" "$parsed"
fi
FAKE_STATUS=503 FAKE_RESPONSE='{"error":{"message":"model is still loading","type":"unavailable"}}'
err=$(PATH="$tmp/bin:$PATH" FAKE_STATUS=$FAKE_STATUS FAKE_RESPONSE=$FAKE_RESPONSE sh "$ask" -u http://h "q" 2>&1 >/dev/null); rc=$?
check "server: error message" "1 qinfer-ask: server error: model is still loading" "$rc $err"

# ---------------------------------------------------------------- the real binary
model="$ref/tiny-qwen35.q4_k_m.gguf"
if [ -x "$qinfer_bin" ] && [ -f "$model" ]; then
    printf '你好' >"$tmp/direct.txt"
    direct=$("$qinfer_bin" run -m "$model" --chat -f "$tmp/direct.txt" -n 8 --temp 0 --no-think 2>/dev/null)
    out=$(QINFER="$qinfer_bin" sh "$ask" -m "$model" -n 8 -t 0 "你好")
    expect=$(printf '%s' "$direct" | awk '{ t = t (NR > 1 ? "\n" : "") $0 } END { while ((i = index(t, "</think>")) > 0) t = substr(t, i + 8); sub(/^[ \t\r\n]+/, "", t); sub(/[ \t\r\n]+$/, "", t); print t }')
    check "real qinfer: same answer as qinfer run --chat" "$expect" "$out"
    [ -n "$out" ] || check "real qinfer: non-empty answer" "something" ""
else
    echo "skip real qinfer case: $qinfer_bin or $model missing"
fi

if [ $failures -gt 0 ]; then
    echo "$failures failure(s)"
    exit 1
fi
echo "all passed"
