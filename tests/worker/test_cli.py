"""The worker's command line: --chunk-bytes is parsed and bad values are refused before anything starts."""

from __future__ import annotations

import pytest

from gradcode.common.wire import DEFAULT_CHUNK_BYTES
from gradcode.worker.__main__ import build_parser, main


def test_chunk_bytes_defaults_to_the_wire_default_and_is_parsed() -> None:
    assert build_parser().parse_args([]).chunk_bytes == DEFAULT_CHUNK_BYTES
    assert build_parser().parse_args(["--chunk-bytes", "65536"]).chunk_bytes == 65536


@pytest.mark.parametrize("value", ["0", "8", "-1", str(1 << 40)])
def test_a_chunk_size_out_of_range_is_refused(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--chunk-bytes", value])
    assert info.value.code == 2
    assert "--chunk-bytes must be in [16," in capsys.readouterr().err
