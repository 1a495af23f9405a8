"""Builds recserve's native libraries with the package: plain C shared objects that
Python loads with ctypes and that C hosts dlopen, so they are named lib<name>.so and
carry no CPython module init; and one CPython extension module (_route_call)."""

import json
import os
import subprocess
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

CFLAGS = ["-O3", "-std=c11", "-fvisibility=hidden", "-Wall", "-Wextra", "-Wno-unused-parameter"]
LDFLAGS: list[str] = []

# `make test-sanitize` builds a copy of the tree with RECSERVE_SANITIZE=1: every library
# under AddressSanitizer and UndefinedBehaviorSanitizer, stopping at the first report.
# (A host process must then preload libasan; the Makefile target shows how.)
if os.environ.get("RECSERVE_SANITIZE") == "1":
    SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-g"]
    CFLAGS = [flag for flag in CFLAGS if flag != "-O3"] + ["-O1", *SANITIZE]
    LDFLAGS = SANITIZE


class SharedLibrary(Extension):
    """A C library loaded by path (ctypes, dlopen), not imported as a module."""


class BuildNative(build_ext):
    def get_ext_filename(self, fullname: str) -> str:
        ext = self.ext_map[fullname]
        if isinstance(ext, SharedLibrary):
            return os.path.join(*fullname.split(".")) + ".so"
        return super().get_ext_filename(fullname)

    def get_export_symbols(self, ext: Extension) -> list[str]:
        if isinstance(ext, SharedLibrary):
            return list(ext.export_symbols or [])
        return super().get_export_symbols(ext)


NATIVE = [
    SharedLibrary(
        "recserve.embedding.librecserve_embedding",
        sources=[
            "native/embedding.c",
            "native/embedding_arena.c",
            "native/embedding_keys.c",
            "native/embedding_ssd.c",
            "native/embedding_tier.c",
        ],
        depends=["native/embedding.h", "native/embedding_internal.h"],
        include_dirs=["native"],
        # No FP contraction: default rows and pooling must match the Python twin bit for bit.
        extra_compile_args=CFLAGS + ["-pthread", "-ffp-contract=off"],
        extra_link_args=["-pthread", "-lm", *LDFLAGS],
    ),
    # ONNX Runtime through its C API, loaded at run time with dlopen (no link-time dependency).
    SharedLibrary(
        "recserve.runtime.librecserve_ort",
        sources=["native/ort_runner.c"],
        depends=["native/ort_runner.h", "native/ort_api.h", "native/dense_run.h"],
        include_dirs=["native"],
        extra_compile_args=CFLAGS + ["-pthread"],
        extra_link_args=["-pthread", "-ldl", *LDFLAGS],
    ),
    SharedLibrary(
        "recserve.wire.librecserve_codec",
        sources=["native/codec.c"],
        depends=["native/codec.h", "native/codec_tfs.inc", "native/varint.h"],
        include_dirs=["native"],
        extra_compile_args=CFLAGS,
        extra_link_args=LDFLAGS,
    ),
    # The native request route (DESIGN §10): plain C, no Python. It parses with its own copy
    # of the codec (a pure function) and reaches the embedding engine and the dense run
    # through function pointers it is given, so tables stay those of the engine Python loaded.
    SharedLibrary(
        "recserve.processor.librecserve_route",
        sources=["native/route.c", "native/route_vocabulary.c", "native/route_int_vocabulary.c", "native/codec.c"],
        depends=["native/route.h", "native/route_vocabulary.h", "native/route_int_vocabulary.h", "native/dense_run.h",
                 "native/codec.h", "native/embedding.h", "native/route_values.inc", "native/route_merge.inc",
                 "native/varint.h"],
        include_dirs=["native"],
        extra_compile_args=CFLAGS + ["-pthread"],
        extra_link_args=["-pthread", *LDFLAGS],
    ),
    # A CPython module (imported, not loaded by path): Python threads' call into the route
    # above, holding the GIL far less of each request than a ctypes call does.
    Extension(
        "recserve.processor._route_call",
        sources=["native/route_call.c"],
        depends=["native/route.h"],
        include_dirs=["native"],
        extra_compile_args=CFLAGS,
        extra_link_args=LDFLAGS,
    ),
]

# The gRPC front end (C++, grpc++): built when grpc++ is installed (`make install` installs
# Debian's libgrpc++-dev); without it the server's gRPC port is grpcio's alone.
def _pkg_config(*args: str) -> list[str] | None:
    try:
        return subprocess.run(["pkg-config", *args, "grpc++"], check=True, capture_output=True,
                              text=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        return None


GRPCXX_CFLAGS, GRPCXX_LIBS = _pkg_config("--cflags"), _pkg_config("--libs")
if GRPCXX_CFLAGS is not None and GRPCXX_LIBS is not None:
    NATIVE.append(
        SharedLibrary(
            "recserve.server.librecserve_grpc_front",
            sources=["native/grpc_front.cc"],
            depends=["native/route.h", "native/tfs_spec.h", "native/tfs_spec.c", "native/varint.h"],
            include_dirs=["native"],
            extra_compile_args=[flag for flag in CFLAGS if flag != "-std=c11"] + ["-std=c++17", "-pthread",
                                                                                  *GRPCXX_CFLAGS],
            extra_link_args=["-pthread", *GRPCXX_LIBS, "-lstdc++", *LDFLAGS],
        )
    )
elif os.environ.get("RECSERVE_REQUIRE_GRPCXX") == "1":
    raise SystemExit("grpc++ is not installed (pkg-config grpc++ failed): `make install` installs libgrpc++-dev")

# The C ABI shim embeds CPython, so it links the interpreter's shared library.
if os.path.exists("native/processor_shim.c"):
    libdir = sysconfig.get_config_var("LIBDIR")
    NATIVE.append(
        SharedLibrary(
            "recserve.libserving_processor",
            sources=["native/processor_shim.c"],
            # processor.h ships inside the package, beside the library (`recserve include-path`).
            depends=["recserve/include/processor.h", "native/route.h"],
            include_dirs=["recserve/include", "native", sysconfig.get_paths()["include"]],
            libraries=[f"python{sysconfig.get_config_var('LDVERSION')}", "dl"],
            library_dirs=[libdir],
            runtime_library_dirs=[libdir],
            # The Python doing the build: its environment is the one to embed when the
            # library is used in place (editable install) rather than from site-packages.
            define_macros=[("RECSERVE_BUILD_PYTHON", json.dumps(sys.executable))],
            extra_compile_args=CFLAGS + ["-pthread"],
            extra_link_args=["-pthread", *LDFLAGS],
        )
    )

setup(ext_modules=NATIVE, cmdclass={"build_ext": BuildNative})
