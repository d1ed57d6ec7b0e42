"""Native accelerators for the corpus build; everything else is configured in pyproject.toml.

Both extensions are optional: where they cannot be compiled (no C compiler or no OpenSSL
headers), the install still succeeds and the corpus code uses its pure-Python paths, which give
byte-identical results, only slower.
"""

from setuptools import Extension, setup

FLAGS = ["-O3", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter", "-fvisibility=hidden"]

setup(
    ext_modules=[
        Extension(
            "multiagenttrainer.corpus._encode",
            ["multiagenttrainer/corpus/native/encode.c"],
            depends=["multiagenttrainer/corpus/native/escape_loop.h"],
            libraries=["crypto"],
            extra_compile_args=FLAGS,
            optional=True,
        ),
        Extension(
            "multiagenttrainer.corpus._statfields",
            ["multiagenttrainer/corpus/native/statfields.c"],
            libraries=["pthread"],
            extra_compile_args=FLAGS,
            optional=True,
        ),
    ]
)
