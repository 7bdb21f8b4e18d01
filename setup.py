"""Build and install llft.

`pip install .` (or `pip install -e .`) does everything: it compiles the LD_PRELOAD shim
(native/*.c -> native/libllft_preload.so, a plain C shared object with no Python
symbols, so it can be preloaded into bash or a JVM), the small library the programs an
application starts are given instead (native/notes/ -> native/libllft_notes.so: the
signals they send, noted), and the cffi module that maps the
shared-memory layout (native/llft_shm.h) for the Python side, then installs the `llft`
command. `cffi_modules` builds the mapping module; the shim is compiled in the same
build_ext step with the same setuptools compiler cffi uses, linked as a plain .so.
"""
import glob
import os

from setuptools import find_packages, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
SHIM_SOURCES = sorted(glob.glob(os.path.join("native", "*.c")))
SHIM_NAME = "libllft_preload.so"
NOTES_SOURCES = [os.path.join("native", "notes", "llft_notes.c")]
NOTES_NAME = "libllft_notes.so"


class BuildExtWithShim(build_ext):
    """build_ext that also links the preload shim as a plain shared library."""

    def run(self):
        super().run()
        self._build_shim()

    def _build_shim(self):
        if SHIM_SOURCES:
            self._link_preload(SHIM_SOURCES, SHIM_NAME, "shim")
        self._link_preload(NOTES_SOURCES, NOTES_NAME, "notes")

    def _link_preload(self, sources, name, tmp_name):
        from setuptools._distutils.ccompiler import new_compiler
        from setuptools._distutils.sysconfig import customize_compiler

        cc = new_compiler(verbose=self.verbose, force=self.force)
        customize_compiler(cc)
        tmp = os.path.join(self.build_temp, tmp_name)
        objects = cc.compile(
            sources,
            output_dir=tmp,
            include_dirs=["native"],
            extra_preargs=["-fPIC", "-O2", "-g", "-Wall", "-Wextra", "-Wno-unused-parameter",
                           "-fvisibility=hidden", "-D_GNU_SOURCE", "-pthread"],
        )
        if self.inplace:
            out_dir = os.path.join(HERE, "native")
        else:
            out_dir = os.path.join(self.build_lib, "native")
        os.makedirs(out_dir, exist_ok=True)
        # Link with the C driver only: no -lpython, it must load into any process.
        cc.link_shared_object(
            objects, name, output_dir=out_dir,
            libraries=["dl", "pthread"],
            extra_preargs=["-shared", "-Wl,-z,now", "-Wl,--no-undefined"],
        )

CONNECT = ["pyspark>=4.0", "pandas>=2.2,<3", "pyarrow>=18", "grpcio>=1.76",
           "grpcio-status>=1.76", "googleapis-common-protos>=1.71", "zstandard>=0.25"]
cffi_modules = []
if os.path.exists(os.path.join("native", "shm_build.py")):
    cffi_modules.append("native/shm_build.py:ffibuilder")
# the agent's heartbeat thread; its C source is in native/pulse/, out of SHIM_SOURCES' glob
if os.path.exists(os.path.join("native", "pulse_build.py")):
    cffi_modules.append("native/pulse_build.py:ffibuilder")
# the wire codec's per-datagram work (llft/protocol/wire.py's native half); native/wire/
if os.path.exists(os.path.join("native", "wire_build.py")):
    cffi_modules.append("native/wire_build.py:ffibuilder")
# a steady lane in C (llft/protocol/messaging/lane.py's SteadyLane); native/lane/
if os.path.exists(os.path.join("native", "lane_build.py")):
    cffi_modules.append("native/lane_build.py:ffibuilder")

setup(
    name="llft",
    version="0.1.0",
    description="Transparent leader-follower replication (LLFT) for unmodified Python processes",
    python_requires=">=3.11",
    packages=find_packages(include=["llft", "llft.*", "membership", "determinizer",
                                    "determinizer.*", "native"]),
    # site/sitecustomize.py is started by a replicated app (PYTHONPATH), not imported
    package_data={"native": ["*.so", "*.h"], "determinizer.grpcrelay": ["site/*.py"]},
    setup_requires=["cffi>=1.16"],
    install_requires=[
        "cffi>=1.16",
        "msgpack>=1.0",
        "psutil>=5.9",
        "scapy>=2.5",
        "pyspark>=3.5",
    ],
    extras_require={
        # the Spark Connect client (pyspark[connect], pandas below 3 as pyspark 4.3 asks)
        "connect": CONNECT,
        "dev": ["pytest>=7", "hypothesis>=6", "matplotlib>=3.7", "pytest-timeout>=2"]
        + CONNECT,
    },
    cffi_modules=cffi_modules,
    cmdclass={"build_ext": BuildExtWithShim},
    entry_points={"console_scripts": ["llft = llft.cli:main"]},
    zip_safe=False,
)
