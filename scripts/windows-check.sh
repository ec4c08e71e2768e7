#!/usr/bin/env bash
# Windows check without Windows: cross-compiles qinfer.exe with MinGW-w64
# (cmake/mingw-w64-x86_64.cmake, build-mingw/), then runs it under wine next to
# the Linux build and requires the same output: `info`, `tokenize` of Chinese +
# English text from the command line and from a file with a Chinese name, and
# short greedy `run`s from token ids, a Chinese -p prompt and a prompt file.
#
#   bash scripts/windows-check.sh            # after the Linux build (build/qinfer)
#
# Environment: QINFER_LINUX_BIN (default build/qinfer), QINFER_REFERENCE_DIR
# (default ../shared/reference), MINGW_BUILD_DIR (default build-mingw), JOBS.
# Without wine the cross build still runs and the smoke test is skipped with a
# message; a missing cross compiler or any mismatch is an error.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD_DIR=${MINGW_BUILD_DIR:-build-mingw}
JOBS=${JOBS:-$(nproc)}
LINUX_BIN=${QINFER_LINUX_BIN:-build/qinfer}
REF=${QINFER_REFERENCE_DIR:-$ROOT/../shared/reference}

say() { printf 'windows-check: %s\n' "$*"; }

# ---------------------------------------------------------------- cross build
if ! command -v x86_64-w64-mingw32-g++-posix >/dev/null 2>&1; then
    say "x86_64-w64-mingw32-g++-posix not found: install mingw-w64 and g++-mingw-w64-x86-64-posix (scripts/setup.sh does)" >&2
    exit 1
fi
t0=$(date +%s)
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
    cmake -S . -B "$BUILD_DIR" -DCMAKE_TOOLCHAIN_FILE="$ROOT/cmake/mingw-w64-x86_64.cmake" \
        -DCMAKE_BUILD_TYPE=Release -DQINFER_CUDA=OFF -DQINFER_TESTS=OFF -DQINFER_BENCH=OFF >/dev/null
fi
cmake --build "$BUILD_DIR" -j"$JOBS" --target qinfer >"$BUILD_DIR/build.log" 2>&1 || {
    tail -n 40 "$BUILD_DIR/build.log" >&2
    say "MinGW build failed (full log: $BUILD_DIR/build.log)" >&2
    exit 1
}
EXE="$ROOT/$BUILD_DIR/qinfer.exe"
say "built $BUILD_DIR/qinfer.exe ($(du -h "$EXE" | cut -f1)) in $(($(date +%s) - t0)) s"
# Only system DLLs: libgcc, libstdc++ and winpthread are linked in statically.
if command -v x86_64-w64-mingw32-objdump >/dev/null 2>&1; then
    dlls=$(x86_64-w64-mingw32-objdump -p "$EXE" | sed -n 's/^\s*DLL Name: //p' | tr 'A-Z' 'a-z' | sort -u | tr '\n' ' ')
    say "imports: $dlls"
    case " $dlls" in *" libstdc++"* | *" libgcc"* | *" libwinpthread"*) say "qinfer.exe needs MinGW DLLs" >&2; exit 1 ;; esac
fi

# ---------------------------------------------------------------- smoke test under wine
WINE=$(command -v wine || command -v wine64 || true)
if [ -z "$WINE" ]; then
    say "SKIPPED the wine smoke test: wine is not installed (Debian packages wine64 and wine)"
    exit 0
fi
[ -x "$LINUX_BIN" ] || { say "Linux binary $LINUX_BIN not found (build it first)" >&2; exit 1; }
LINUX_BIN=$(cd "$(dirname "$LINUX_BIN")" && pwd)/$(basename "$LINUX_BIN")
for f in tiny-qwen35.q4_k_m.gguf vocab-qwen35.gguf; do
    [ -f "$REF/$f" ] || { say "reference file $REF/$f not found (set QINFER_REFERENCE_DIR)" >&2; exit 1; }
done

WORK=$(mktemp -d "${TMPDIR:-/tmp}/qinfer-windows-check.XXXXXX")
WINESERVER=$(command -v wineserver || ls /usr/lib/wine/wineserver64 2>/dev/null || true)
trap '[ -z "$WINESERVER" ] || "$WINESERVER" -k 2>/dev/null; rm -rf "$WORK"' EXIT
export WINEPREFIX="$WORK/wineprefix" WINEDEBUG=-all WINEDLLOVERRIDES="mscoree,mshtml=" WINEARCH=win64
# UTF-8 locale: wine converts the Unix command line to UTF-16 with it.
export LC_ALL=C.UTF-8
# Both binaries run in one folder on the same relative file names, so that
# paths in their output are the same.
cd "$WORK"
cp "$REF/tiny-qwen35.q4_k_m.gguf" model.gguf
cp "$REF/vocab-qwen35.gguf" vocab.gguf
TEXT='Hello 世界! 你好，qinfer。 Zhōngwén 中文 123 😀'
printf '%s\n第二行：混合 English 和中文。\n' "$TEXT" >"中文提示.txt"
printf '请用中文回答：什么是量化？' >"提示.txt"

t0=$EPOCHREALTIME
"$WINE" "$EXE" --version >wine-start.out 2>&1 </dev/null || { cat wine-start.out >&2; say "qinfer.exe does not start under wine" >&2; exit 1; }
say "wine first start (new prefix + qinfer.exe --version): $(awk "BEGIN { printf \"%.1f\", $EPOCHREALTIME - $t0 }") s"

failures=0
# same NAME ARGS...: runs both builds with ARGS (standard input from $STDIN,
# default none), compares exit status and stdout (CRLF line ends of the
# Windows text-mode stdout made LF).
same() {
    local name=$1
    shift
    local lrc=0 wrc=0
    "$LINUX_BIN" "$@" >linux.out 2>linux.err <"${STDIN:-/dev/null}" || lrc=$?
    "$WINE" "$EXE" "$@" >wine.raw 2>wine.err <"${STDIN:-/dev/null}" || wrc=$?
    tr -d '\r' <wine.raw >wine.out
    if [ "$lrc" = "$wrc" ] && cmp -s linux.out wine.out && [ -s linux.out ]; then
        say "ok   $name ($(wc -l <linux.out) lines)"
    else
        say "FAIL $name: exit status linux $lrc, windows $wrc"
        diff linux.out wine.out | head -n 20 || true
        head -n 5 linux.err wine.err || true
        failures=$((failures + 1))
    fi
}
# fails NAME ARGS...: both builds exit 1 with a one-line "error: ..." message.
fails() {
    local name=$1
    shift
    local lrc=0 wrc=0
    "$LINUX_BIN" "$@" >/dev/null 2>linux.err </dev/null || lrc=$?
    "$WINE" "$EXE" "$@" >/dev/null 2>wine.raw </dev/null || wrc=$?
    tr -d '\r' <wine.raw | grep -v '^wine: ' >wine.err || true
    if [ "$lrc" = 1 ] && [ "$wrc" = 1 ] && [ "$(wc -l <wine.err)" = 1 ] && grep -q '^error: ' wine.err; then
        say "ok   $name ($(cat wine.err))"
    else
        say "FAIL $name: exit status linux $lrc, windows $wrc"
        cat wine.err
        failures=$((failures + 1))
    fi
}

same "info" info model.gguf
same "info --sha256 (built-in SHA-256 on Windows)" info model.gguf --sha256 ""
same "tokenize --text (Chinese + English)" tokenize -m vocab.gguf --text "$TEXT"
same "tokenize --ids-only --text, tiny model" tokenize -m model.gguf --ids-only --text "$TEXT"
same "tokenize --file with a Chinese file name" tokenize -m vocab.gguf --ids-only --whole-file --file "中文提示.txt"
# Piped input is bytes on Windows too: CRLF and a Ctrl+Z byte stay in the text.
printf 'line 1\r\n第二行\r\n\032 after Ctrl+Z\n' >stdin.txt
STDIN=stdin.txt same "tokenize --file - (CRLF, Ctrl+Z byte)" tokenize -m vocab.gguf --ids-only --whole-file --file -
# Interactive chat with piped lines (Chinese, one with a CRLF end): same replies.
printf '你好\r\n请介绍一下你自己\n/exit\n' >chat.txt
STDIN=chat.txt same "chat, two piped Chinese turns" chat -m model.gguf -t 2 -n 6 --temp 0 --no-think
same "run --ids, 16 greedy tokens" run -m model.gguf -t 2 --ids 39,4791,220,3490,11,100,1000 -n 16 --temp 0 --print-ids --ignore-eos
same "run -p 你好, greedy" run -m model.gguf -t 2 -p "你好" -n 12 --temp 0 --ignore-eos
same "run --chat -f 提示.txt, greedy" run -m model.gguf -t 2 --chat -f "提示.txt" -n 12 --temp 0 --ignore-eos --no-think
# The prompt must reach the model intact: the prompt ids run prints on stderr agree.
"$LINUX_BIN" run -m model.gguf -p "$TEXT" -n 1 --temp 0 --verbose-prompt 2>&1 >/dev/null </dev/null | grep '^prompt ids' >linux.ids || true
"$WINE" "$EXE" run -m model.gguf -p "$TEXT" -n 1 --temp 0 --verbose-prompt 2>&1 >/dev/null </dev/null | tr -d '\r' | grep '^prompt ids' >wine.ids || true
if [ -s linux.ids ] && cmp -s linux.ids wine.ids; then
    say "ok   run -p: the same prompt ids ($(cut -c1-60 linux.ids)...)"
else
    say "FAIL run -p: prompt ids differ"; cat linux.ids wine.ids; failures=$((failures + 1))
fi
fails "missing model file" info "没有这个文件.gguf"
fails "bad token id" run -m model.gguf --ids 1,x -n 1

if [ "$failures" -gt 0 ]; then
    say "$failures case(s) differ between the Linux and the Windows build"
    exit 1
fi
say "Linux and Windows (wine) outputs agree"
