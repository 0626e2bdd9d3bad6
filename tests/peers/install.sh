#!/usr/bin/env bash
# Installs the real third-party peers the fidelity test and the benchmarks
# drive, from PyPI into this directory, and from Debian (nginx, OpenSSL
# headers) where missing:
#
#   .venv/            Python virtualenv: openai SDK, rotel, gguf,
#                     llama-cpp-python[server] (Python part), cmake, ninja
#   .build/llama.cpp  llama.cpp built once from the llama-cpp-python sdist:
#                     the shared libraries llama-cpp-python loads
#                     (LLAMA_CPP_LIB_PATH) and the native llama-server
#   .model/           tiny random-weight GGUF model (make_model.py)
#   /usr/sbin/nginx   Debian's nginx (the gateway test's reverse proxy),
#                     installed with apt when missing (as root)
#
# Idempotent: a stamp file records what was built from which inputs; run it
# again and it only checks. Times of each step are printed (and written to
# .install-times) so CI budgets can be tracked.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
LLAMA_CPP_PYTHON=0.3.36
venv="$here/.venv"
build="$here/.build"
src="$build/llama_cpp_python-$LLAMA_CPP_PYTHON"
jobs="${PEERS_JOBS:-$(nproc)}"
stamp="$here/.installed"
want="llama-cpp-python=$LLAMA_CPP_PYTHON requirements=$(sha256sum requirements.txt requirements-tokenizers.txt tokenizer_vectors.py make_model.py install.sh | sha256sum | cut -c1-16)"

if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    echo "peers: installed ($want)"
    exit 0
fi

: > "$here/.install-times"
step() { # step NAME COMMAND... : runs and times one step
    local name="$1"; shift
    local t0=$SECONDS
    echo "peers: $name ..."
    "$@"
    local dt=$((SECONDS - t0))
    echo "peers: $name done in ${dt}s"
    echo "$name ${dt}s" >> "$here/.install-times"
}

make_venv() {
    [[ -x "$venv/bin/python" ]] || python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r requirements.txt
}

fetch_sdist() {
    mkdir -p "$build"
    if [[ ! -d "$src" ]]; then
        # --no-binary for this one package only (build dependencies stay wheels).
        "$venv/bin/pip" download --quiet --disable-pip-version-check --no-deps \
            --no-binary llama-cpp-python "llama-cpp-python==$LLAMA_CPP_PYTHON" -d "$build"
        tar -xzf "$build/llama_cpp_python-$LLAMA_CPP_PYTHON.tar.gz" -C "$build"
    fi
}

# One build serves both engines: shared libraries for the Python server
# and the native llama-server (cpp-httplib, with OpenSSL: one binary serves
# the plaintext tests and, with --ssl-key-file/--ssl-cert-file, the TLS
# ones). No web UI, no network at build time, portable code
# (GGML_NATIVE=OFF).
llama_cmake_args=(
    -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=OFF
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
    -DLLAMA_OPENSSL=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_APP=OFF
)
llama_built_stamp="$build/llama.cpp/.built-from"
llama_built_want="llama-cpp-python=$LLAMA_CPP_PYTHON generator=Ninja cmake=$(printf '%s\n' "${llama_cmake_args[@]}" | sha256sum | cut -c1-16)"

llama_cpp_built() {
    # Is $build/llama.cpp a finished build of this sdist with these options?
    # Its own stamp says so (written after a successful build); a tree from
    # before the stamp existed counts when its outputs are there and its
    # CMake cache names this sdist's source and every option above.
    local tree="$build/llama.cpp" opt
    [[ -x "$tree/bin/llama-server" && -e "$tree/bin/libllama.so" && -f "$tree/CMakeCache.txt" ]] || return 1
    if [[ -f "$llama_built_stamp" ]]; then
        [[ "$(cat "$llama_built_stamp")" == "$llama_built_want" ]]
        return
    fi
    grep -qxF "CMAKE_HOME_DIRECTORY:INTERNAL=$src/vendor/llama.cpp" "$tree/CMakeCache.txt" || return 1
    grep -qxF "CMAKE_GENERATOR:INTERNAL=Ninja" "$tree/CMakeCache.txt" || return 1
    for opt in "${llama_cmake_args[@]}"; do
        opt="${opt#-D}"
        grep -qE "^${opt%%=*}:[A-Z]+=${opt#*=}\$" "$tree/CMakeCache.txt" || return 1
    done
}

need_openssl_headers() {
    # llama-server's HTTPS needs OpenSSL's headers (Debian: libssl-dev).
    [[ -f /usr/include/openssl/ssl.h ]] && return
    if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
        apt_install libssl-dev
    else
        echo "peers: OpenSSL headers missing: install libssl-dev (Debian) and run again" >&2
        exit 1
    fi
}

apt_install() {
    # Debian packages, as root: the package lists are refreshed once if the
    # install fails on stale ones. Services a package would start are not
    # (policy-rc.d, only while this runs, only if none is there).
    local policy=/usr/sbin/policy-rc.d ours=0 rc=0
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy" && ours=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@" ||
        { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@"; } ||
        rc=$?
    [[ $ours -eq 1 ]] && rm -f "$policy"
    return $rc
}

need_nginx() {
    # The gateway test's reverse proxy: Debian's nginx.
    [[ -x /usr/sbin/nginx ]] && return
    if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
        apt_install nginx-light
    else
        echo "peers: nginx missing: install nginx (Debian) and run again" >&2
        exit 1
    fi
}

build_llama_cpp() {
    # The compile takes 4–11 minutes on 2 vCPUs (250 s in CI, 2026-12-02),
    # so a change elsewhere (say
    # requirements.txt, which re-runs this script) must not redo it: skip a
    # finished tree (ninja alone would still rebuild the server's UI step,
    # which is always out of date).
    if llama_cpp_built; then
        echo "$llama_built_want" > "$llama_built_stamp"
        echo "peers: llama.cpp already built ($llama_built_want)"
        return
    fi
    rm -f "$llama_built_stamp"
    need_openssl_headers
    PATH="$venv/bin:$PATH" cmake -S "$src/vendor/llama.cpp" -B "$build/llama.cpp" -G Ninja \
        "${llama_cmake_args[@]}" > "$build/cmake.log"
    PATH="$venv/bin:$PATH" cmake --build "$build/llama.cpp" -j "$jobs" --target llama-server llama
    # CMake only warns when OpenSSL is missing; the TLS tests need it.
    if ! ldd "$build/llama.cpp/bin/llama-server" | grep -q 'libssl\.so'; then
        echo "peers: llama-server was built without OpenSSL (see $build/cmake.log)" >&2
        exit 1
    fi
    echo "$llama_built_want" > "$llama_built_stamp"
}

tokenizer_vectors() {
    # The tokenizer path's ground truth (tests/tests/tokenizers.rs): real
    # tokenizer.json files from PyPI wheels encoded by Python's tokenizers,
    # llama.cpp's chat templates rendered by transformers. A venv of its
    # own: transformers' pins (httpx, huggingface-hub) are not the SDK's.
    [[ -x "$here/.venv-tok/bin/python" ]] || python3 -m venv "$here/.venv-tok"
    "$here/.venv-tok/bin/pip" install --quiet --disable-pip-version-check -r requirements-tokenizers.txt
    "$here/.venv-tok/bin/python" tokenizer_vectors.py "$here/.tokenizers" "$src"
}

install_python_server() {
    # The Python package without its own copy of llama.cpp: it loads the
    # libraries built above (LLAMA_CPP_LIB_PATH, set by whoever starts it).
    CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" \
        "$venv/bin/pip" install --quiet --disable-pip-version-check "${src}[server]"
}

step venv make_venv
step sdist fetch_sdist
step llama.cpp build_llama_cpp
step llama-cpp-python install_python_server
step nginx need_nginx
step tokenizers tokenizer_vectors
step model "$venv/bin/python" make_model.py --vocab "$src/vendor/llama.cpp/models/ggml-vocab-llama-spm.gguf" --out "$here/.model"
echo "$want" > "$stamp"
echo "peers: ready"; cat "$here/.install-times"
