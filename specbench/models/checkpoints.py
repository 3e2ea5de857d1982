"""Reading specbench checkpoints (a Lightning ``last.ckpt`` or an exported ``trained.pt``).

:func:`read_checkpoint_metadata` reads only the ``specbench`` metadata, without torch and without
running any code from the file (a restricted unpickler that never builds a tensor), so config
validation can refuse a checkpoint of another method or model pair before torch or a model loads.
"""

from __future__ import annotations

import pickle
import zipfile
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from typing_extensions import Self

if TYPE_CHECKING:
    import torch

PROJECT_ROOT = Path(__file__).resolve().parents[2]
METADATA_KEY = "specbench"
HINT = "pass the last.ckpt or trained.pt that task=train wrote"
# Globals a checkpoint's pickle may name that are plain data; anything else becomes a placeholder.
_PLAIN_GLOBALS = {
    ("collections", "OrderedDict"): OrderedDict,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("builtins", "slice"): slice,
    ("builtins", "complex"): complex,
}


class CheckpointReadError(ValueError):
    """The file is not a specbench checkpoint (missing, not a torch file, or without specbench metadata)."""


class _Placeholder:
    """Stands for a tensor, storage or any other object the metadata does not need."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        return super().__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        pass

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def append(self, value: Any) -> None:
        pass

    def extend(self, values: Any) -> None:
        pass


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        return _PLAIN_GLOBALS.get((module, name), _Placeholder)

    def persistent_load(self, pid: Any) -> Any:
        return _Placeholder()


def resolve_project_path(path: str) -> str:
    """``path`` as given when it exists (or is a hub id); a relative path that does not exist from the
    working directory is read from the project root (the committed files under ``checkpoints/``)."""
    given = Path(str(path)).expanduser()
    if given.is_absolute() or given.exists():
        return str(given)
    in_project = PROJECT_ROOT / given
    return str(in_project) if in_project.exists() else str(path)


def _not_a_checkpoint(path: Path, why: str) -> CheckpointReadError:
    return CheckpointReadError(
        f"checkpoint {str(path)!r} cannot be read: it is not a specbench checkpoint ({why}); {HINT}"
    )


def _existing(path: str | Path) -> Path:
    path = Path(path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"checkpoint {str(path)!r} does not exist")
    if not path.is_file():
        raise _not_a_checkpoint(path, "a directory, not a file")
    return path


def read_checkpoint_metadata(path: str | Path) -> dict:
    """The ``specbench`` metadata of a checkpoint (method, verifier and drafter names, ...), torch-free.

    Raises FileNotFoundError for a missing file and :class:`CheckpointReadError` (a ValueError) for a file
    that is not a specbench checkpoint.
    """
    path = _existing(path)
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            pickles = [name for name in names if name.endswith("/data.pkl") or name == "data.pkl"]
            if not pickles:
                raise _not_a_checkpoint(path, "a zip archive without the data.pkl of torch.save")
            data = _MetadataUnpickler(archive.open(pickles[0])).load()
    except zipfile.BadZipFile:
        raise _not_a_checkpoint(path, "not a file written by torch.save") from None
    except CheckpointReadError:
        raise
    except Exception as err:  # noqa: BLE001 - any unreadable pickle means the same to the user
        raise _not_a_checkpoint(path, f"its contents cannot be read: {type(err).__name__}") from None
    return _metadata_of(data, path)


def _metadata_of(data: Any, path: Path) -> dict:
    if not isinstance(data, Mapping) or "state_dict" not in data or METADATA_KEY not in data:
        raise _not_a_checkpoint(path, f"no state_dict / {METADATA_KEY} metadata")
    metadata = data[METADATA_KEY]
    if not isinstance(metadata, Mapping):
        raise _not_a_checkpoint(path, f"its {METADATA_KEY} metadata is not a mapping")
    return dict(metadata)


def read_checkpoint(path: str | Path) -> tuple[Mapping[str, torch.Tensor], dict]:
    """The trained weights and metadata of a specbench checkpoint (a Lightning .ckpt or an exported .pt).

    The metadata is checked first (:func:`read_checkpoint_metadata`), so a foreign file gets the same
    one-line error with or without torch; weights are then loaded with ``weights_only=True``.
    """
    import torch

    path = _existing(path)
    read_checkpoint_metadata(path)
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - torch's message advises unsafe loading: never pass it on
        raise _not_a_checkpoint(path, f"its weights cannot be loaded safely: {type(err).__name__}") from None
    return data["state_dict"], _metadata_of(data, path)
