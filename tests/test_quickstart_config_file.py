"""One quickstart config: configs/quickstart.toml (what the README shows) is the file the package ships
and `smelt quickstart` reads, so the two cannot drift apart."""

from pathlib import Path

from smelt.cli.pipeline import QUICKSTART_CONFIG

REPO = Path(__file__).resolve().parents[1]


def test_the_readmes_quickstart_config_is_the_packaged_one():
    shown = REPO / "configs" / "quickstart.toml"
    assert shown.resolve() == QUICKSTART_CONFIG.resolve()  # a link, not a copy
    assert QUICKSTART_CONFIG.is_file()
