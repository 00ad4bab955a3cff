"""Builds the `voice` package from proto/voice/**/*.proto with grpcio-tools.

The generated modules (`voice.tts.v1.tts_pb2`, `..._pb2_grpc`, `.pyi` stubs) are written
into the build tree only; the .proto files stay the single source of truth.
"""

from __future__ import annotations

import pathlib

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = pathlib.Path(__file__).parent.resolve()


def _protos() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "voice").rglob("*.proto"))


class BuildProtos(build_py):
    def run(self) -> None:
        from grpc_tools import protoc

        out = pathlib.Path(self.build_lib)
        out.mkdir(parents=True, exist_ok=True)
        protos = _protos()
        args = [
            "grpc_tools.protoc",
            f"-I{ROOT}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            f"--mypy_out={out}",
            f"--mypy_grpc_out={out}",
            *protos,
        ]
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed on {protos}")
        for pkg in {pathlib.Path(p).parent for p in protos} | {pathlib.Path("voice")}:
            for d in [pkg, *pkg.parents]:
                if str(d) != ".":
                    (out / d / "__init__.py").touch()
            (out / pkg / "py.typed").touch()
        super().run()


setup(
    # The package dirs hold only .proto files in the source tree; build_py fills them.
    packages=["voice", "voice.tts", "voice.tts.v1", "voice.llm", "voice.llm.v1"],
    cmdclass={"build_py": BuildProtos},
)
