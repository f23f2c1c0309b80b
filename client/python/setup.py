"""Builds moe_sidecar's C extension with libmoe_client compiled in (no other library to link,
no build-time dependency beyond Python's headers): `pip install ./client/python`. Offline,
into a venv: `pip install --no-build-isolation ./client/python` (uses the venv's setuptools).
The project's own build (scripts/build.sh) makes the same package in build/python/."""

import os

from setuptools import Extension, setup

here = os.path.dirname(os.path.abspath(__file__))
repo = os.path.normpath(os.path.join(here, "..", ".."))


def rel(*p):
    return os.path.relpath(os.path.join(repo, *p), here)


setup(
    ext_modules=[
        Extension(
            "moe_sidecar._native",
            sources=["moe_sidecar/_native.c", rel("client", "client.c"),
                     rel("client", "placement.c"), rel("proto", "proto.c"),
                     rel("proto", "fingerprint.c")],
            include_dirs=[rel("client", "include"), rel("proto", "include")],
            define_macros=[("Py_LIMITED_API", "0x030B0000"), ("_GNU_SOURCE", None),
                           ("MOE_API", "")],
            extra_compile_args=["-std=c11", "-O2", "-fvisibility=hidden"],
            py_limited_api=True,
        )
    ],
    options={"bdist_wheel": {"py_limited_api": "cp311"}},
)
