"""The worker's command line: --chunk-bytes is parsed and bad values are refused before anything starts."""

from __future__ import annotations

import pytest

from gradcode.worker.__main__ import build_parser, main


def test_chunk_bytes_defaults_to_sized_per_message_and_is_parsed() -> None:
    assert build_parser().parse_args([]).chunk_bytes == 0  # 0: chunk_bytes_for each message's size
    assert build_parser().parse_args(["--chunk-bytes", "65536"]).chunk_bytes == 65536


@pytest.mark.parametrize("value", ["8", "-1", str(1 << 40)])
def test_a_chunk_size_out_of_range_is_refused(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--chunk-bytes", value])
    assert info.value.code == 2
    assert "--chunk-bytes must be 0 (sized to each message) or in [16," in capsys.readouterr().err
