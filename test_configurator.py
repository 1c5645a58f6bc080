"""
Tests of configurator.py: a config file, then --key=value flags over it, and every unknown key
or wrong type reported with the valid keys (read through settings.get_config, as the scripts do).
Run: python -m pytest -q test_configurator.py
"""

import pytest

import configurator
import settings
import train
from cli import ConfigError


def test_config_file_then_flags(tmp_path):
    path = tmp_path / "my_config.py"
    path.write_text("import math\nbatch_size = 7\nlearning_rate = 1e-3\nout_dir = 'from-file'\n"
                    "_scratch = 5\ndef helper():\n    pass\n")
    config = settings.get_config([str(path), "--batch_size=9", "--min_lr=0", "--dtype=float16", "--compile=False"])
    assert config["batch_size"] == 9  # the flag wins over the file
    assert config["learning_rate"] == 1e-3 and config["out_dir"] == "from-file"
    assert config["min_lr"] == 0.0 and isinstance(config["min_lr"], float)  # int accepted for float
    assert config["dtype"] == "float16" and config["compile"] is False
    assert config["max_iters"] == settings.DEFAULTS["max_iters"]


def test_unknown_key_lists_the_valid_keys(capsys):
    with pytest.raises(ConfigError, match="unknown key 'batch_sise'") as e:
        settings.get_config(["--batch_sise=3"])
    assert "valid keys:" in str(e.value) and "batch_size" in str(e.value)
    assert train.main(["--batch_sise=3"]) == 2
    err = capsys.readouterr().err
    assert "unknown key 'batch_sise'" in err and "Traceback" not in err


def test_wrong_types_are_all_reported():
    with pytest.raises(ConfigError) as e:
        settings.get_config(["--batch_size=3.5", "--compile=1", "--learning_rate=fast"])
    message = str(e.value)
    assert "batch_size=3.5" in message and "compile=1" in message and "learning_rate='fast'" in message
    with pytest.raises(ConfigError, match="flags are written --key=value"):
        configurator.parse(["--batch_size"])
    with pytest.raises(ConfigError, match="not found"):
        configurator.parse(["config/no_such_config.py"])
