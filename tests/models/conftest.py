"""A hub stand-in on loopback (`hub.py`) serving small GGUFs, selected with `HF_ENDPOINT`, and a data directory.

The GGUFs are random-weight models in a tiny shape (`homeai bench model --shape tiny`, 5 MB): real
headers (architecture, context length, file type), so listing and describing them is real too.
"""

from __future__ import annotations

import pytest

from tests.models.hub import Hub, start

TINY = "acme/Tiny-GGUF"
SPLIT = "acme/Split-GGUF"
PIECE = 256 * 1024  # huggingface_hub's download chunk in these tests (10 MiB by default): progress and resume points


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory) -> bytes:
    from homeai.bench.random_model import write

    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write(path, "tiny", "q8_0")
    return path.read_bytes()


@pytest.fixture(scope="session")
def tiny_mmproj(tmp_path_factory) -> bytes:
    """A vision projector for the tiny shape (`homeai bench model --mmproj`: random weights, 64 wide)."""
    from homeai.bench.random_mmproj import write_mmproj

    path = tmp_path_factory.mktemp("mmproj") / "mmproj.gguf"
    write_mmproj(path, 64)
    return path.read_bytes()


@pytest.fixture(scope="session")
def tiny_split(tmp_path_factory, tiny_gguf) -> dict[str, bytes]:
    """The tiny model split in three parts as llama.cpp's gguf-split writes them (`-0000k-of-00003.gguf`,
    the tensors spread over the parts): file name -> bytes. llama.cpp loads it from the first part."""
    import gguf

    source = tmp_path_factory.mktemp("split") / "tiny.gguf"
    source.write_bytes(tiny_gguf)
    reader = gguf.GGUFReader(source)
    out = source.parent / "out" / "split-Q8_0.gguf"
    out.parent.mkdir()
    writer = gguf.GGUFWriter(out, reader.fields["general.architecture"].contents(), split_max_tensors=8)
    for name, field in reader.fields.items():
        if not name.startswith("GGUF.") and name != "general.architecture":
            array = field.types[0] == gguf.GGUFValueType.ARRAY
            writer.add_key_value(name, field.contents(), field.types[0], sub_type=field.types[-1] if array else None)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, tensor.data, raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    parts = {p.name: p.read_bytes() for p in sorted(out.parent.iterdir())}
    assert list(parts) == [f"split-Q8_0-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    return parts


def other_bytes(data: bytes, mark: bytes) -> bytes:
    """The same model with its last bytes (tensor data) changed: another file with a valid header."""
    return data[:-len(mark)] + mark


@pytest.fixture
def hub(tiny_gguf, tiny_split, tiny_mmproj, monkeypatch):
    from huggingface_hub import constants

    stand_in = Hub()
    stand_in.add(TINY, "tiny-Q8_0.gguf", tiny_gguf)
    stand_in.add(TINY, "tiny-Q4_K_M.gguf", other_bytes(tiny_gguf, b"q4km"))
    stand_in.add(TINY, "mmproj-tiny-F32.gguf", other_bytes(tiny_mmproj, b"f32!"))
    stand_in.add(TINY, "mmproj-tiny-F16.gguf", tiny_mmproj)
    stand_in.add(TINY, "README.md", b"# tiny\n")
    for name, data in tiny_split.items():
        stand_in.add(SPLIT, f"Q8_0/{name}", data)
    server, thread = start(stand_in)
    monkeypatch.setenv("HF_ENDPOINT", stand_in.url)
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", PIECE)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", "/nonexistent/hf-token")  # no token `hf auth login` saved
    yield stand_in
    server.shutdown()
    server.server_close()
    thread.join(10)


@pytest.fixture
def models(tmp_path):
    return tmp_path / "data" / "models"
