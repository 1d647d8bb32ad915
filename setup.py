"""Build hook: generate code from the specs and compile the shim.

Everything else is in pyproject.toml. Generated code is produced here, at
build time, and never committed (docs/spec-format.md).
"""
import os
import shutil
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = Path(__file__).resolve().parent


class BuildWithShim(build_py):
    def run(self):
        # a build folder left from an earlier layout would ship modules that
        # no longer exist in the sources (and mask broken imports): start clean
        shutil.rmtree(Path(self.build_lib) / "gpuproxy", ignore_errors=True)
        super().run()
        sys.path.insert(0, str(HERE))
        from autogen.build import BuildError, build_all
        temp = Path(self.get_finalized_command("build").build_temp) / "gpuproxy"
        try:
            build_all(Path(self.build_lib), temp, self.distribution.get_version())
        except BuildError as e:
            sys.exit(f"gpuproxy build failed: {e}")


class BinaryDistribution(Distribution):
    """The package ships native libraries: wheels are platform-specific."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildWithShim}, distclass=BinaryDistribution)
