"""Where the built native artefacts live: the preload shim and the shared-memory mapping."""
import os

SHIM_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libllft_preload.so")


def shim_path() -> str:
    """Absolute path of libllft_preload.so; a clear error if the package was not built."""
    if not os.path.exists(SHIM_PATH):
        raise FileNotFoundError(
            f"llft preload shim not built ({SHIM_PATH} missing): run scripts/setup.sh")
    return SHIM_PATH
