"""Output folders and atomic writes: every output appears complete or not at all.

One policy for every writer (`output_folder`, `atomic_file`, the completion marker
`MARKER`); nothing it does not own is deleted (docs/guides/files_and_safety.md).
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import json
import logging
import os
import re
import secrets
import shutil
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path

logger = logging.getLogger("hf_posext")

#: The completion marker: written last into every finished folder, with the size of every file.
MARKER = ".hf_posext-complete.json"
_INPLACE_PREFIX = ".hf_posext.tmp-"
#: Renames that fail this way mean "OUT cannot be replaced by a rename" (a mount point, another
#: filesystem): the files are moved in one by one instead.
_IN_PLACE_ERRNOS = (errno.EBUSY, errno.EXDEV)


def default_cache_dir() -> Path:
    """The cache of tokenized blocks, digests and tiny models: ``$HF_POSEXT_CACHE``, else ``~/.cache/hf_posext``."""
    return Path(os.environ.get("HF_POSEXT_CACHE", Path.home() / ".cache" / "hf_posext"))


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def _umask() -> int:
    """The process's umask, read without changing it where Linux allows (changing it is not thread-safe)."""
    try:
        with open(f"/proc/{os.getpid()}/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


def _give_usual_mode(path: Path) -> None:
    """Give a finished file (or every file under a finished folder) the mode a plain ``open`` gives it.

    Writers that stage through a temporary file of their own (safetensors' ``save_file``) leave
    it 0600; a file we write is as readable as any other file the user writes: 0666 less the
    umask, plus the execute bits it had (less the umask).
    """
    umask = _umask()
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file() and not p.is_symlink()]
    for file in files:
        current = stat.S_IMODE(file.stat().st_mode)
        wanted = (0o666 | (current & 0o111)) & ~umask
        if current != wanted:
            file.chmod(wanted)


def _files(folder: Path) -> dict[str, int]:
    """``{relative posix path: size}`` of the files under ``folder``, our own temporaries excepted."""
    found = {}
    for path in folder.rglob("*"):
        rel = path.relative_to(folder).as_posix()
        if path.is_file() and rel != MARKER and not rel.startswith(_INPLACE_PREFIX):
            found[rel] = path.stat().st_size
    return found


def write_marker(folder: str | os.PathLike) -> Path:
    """Write the completion marker of ``folder`` (atomically), listing every file and its size."""
    folder = Path(folder)
    return write_text(folder / MARKER, json.dumps({"files": _files(folder)}, indent=1, sort_keys=True) + "\n")


def verify_folder(folder: str | os.PathLike) -> str | None:
    """None when ``folder`` is complete (its marker matches its files), else why it is not."""
    folder = Path(folder)
    if not folder.is_dir():
        return "not a folder"
    try:
        listed = json.loads((folder / MARKER).read_text())["files"]
    except FileNotFoundError:
        return f"no completion marker ({MARKER}): its write was interrupted"
    except (ValueError, KeyError, TypeError) as err:
        return f"unreadable completion marker {MARKER} ({err})"
    for name, size in sorted(listed.items()):
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != size:
            return f"{name} is {path.stat().st_size} bytes, {size} when it was written (truncated or changed)"
    return None


def _remove_tree(path: Path) -> None:
    """Delete a folder, its marker first: a delete killed half-way never looks complete."""
    (path / MARKER).unlink(missing_ok=True)
    shutil.rmtree(path, ignore_errors=True)


def clean_stale(target: str | os.PathLike) -> None:
    """Remove the temporaries a killed write of ``target`` left (their process is gone).

    Folders (`output_folder`'s ``.NAME.tmp-PID-*``, ``.NAME.old-PID``, ``NAME/.hf_posext.tmp-PID-*``)
    and files (`atomic_file`'s ``.NAME.PID.tmp``).

    A staged folder that holds the completion marker is a finished output whose move failed:
    it is kept, and a warning says where it is.
    """
    target = Path(target)
    name = re.escape(target.name)
    # tmp-PID-RANDOM (a name without a PID is an older release's: stale too), old-PID.
    staged = re.compile(rf"^\.{name}\.tmp-(?:(\d+)-)?")
    inside = re.compile(rf"^{re.escape(_INPLACE_PREFIX)}(\d+)-")
    old = re.compile(rf"^\.{name}\.old-(\d+)?")
    single = re.compile(rf"^\.{name}\.(\d+)\.tmp$")
    if not target.parent.is_dir():
        return
    for path in target.parent.iterdir():
        match = single.match(path.name)
        if match and path.is_file() and not path.is_symlink() and not _pid_alive(int(match.group(1))):
            path.unlink(missing_ok=True)
    candidates = [(p, staged.match(p.name) or old.match(p.name)) for p in target.parent.iterdir()]
    if target.is_dir():
        candidates += [(p, inside.match(p.name)) for p in target.iterdir()]
    for path, match in candidates:
        if match is None or not path.is_dir():
            continue
        if match.group(1) is not None and _pid_alive(int(match.group(1))):
            continue
        if match.re is not old and (path / MARKER).exists():
            logger.warning(
                "%s holds a complete output of an earlier run whose final move failed; "
                "it is kept: move it into place or delete it",
                path,
            )
            continue
        _remove_tree(path)


def _owned(name: str, owns: Sequence[str] | None) -> bool:
    top = name.split("/", 1)[0]
    return owns is None or any(fnmatch.fnmatchcase(top, pattern) for pattern in owns)


def _entries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name != MARKER and not p.name.startswith(_INPLACE_PREFIX))


def _shown(names: Sequence[str]) -> str:
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def check_output_dir(
    path: str | os.PathLike,
    *,
    overwrite: bool = False,
    sources: Sequence[str | os.PathLike] = (),
    owns: Sequence[str] | None = None,
    reuse_own: bool = False,
) -> Path:
    """Refuse an output folder the writer must not write to; returns ``path`` as a Path.

    Args:
        path: the output folder.
        overwrite: write into a non-empty folder (replacing only what the writer owns).
        sources: folders the writer reads from; ``path`` may be neither one of them nor inside one.
        owns: name patterns of the top-level entries the writer writes (None: all of them).
        reuse_own: a folder holding only the writer's own files is not "non-empty" (resumable results).

    Raises:
        ValueError: naming the folder and what to do instead.
    """
    target = Path(path)
    if target.exists() and not target.is_dir():
        raise ValueError(f"output folder {str(target)!r} is an existing file; give a folder path (nothing was written)")
    refuse_file_above(target, "output folder")
    real = Path(os.path.realpath(target))
    for source in sources:
        src = Path(os.path.realpath(source))
        if real == src or src in real.parents:
            where = "is" if real == src else "is inside"
            raise ValueError(
                f"output folder {str(target)!r} {where} the source {str(source)!r}; write to a separate folder"
            )
    entries = _entries(target) if target.is_dir() else []
    replaced = [name for name in entries if _owned(name, owns)]
    if entries and not overwrite:
        foreign = [name for name in entries if not _owned(name, owns)] if reuse_own else entries
        if foreign:
            kept = [name for name in entries if name not in replaced]
            said = (
                f"to replace {_shown(replaced)} (this command writes them)"
                if replaced
                else "to write into it (it replaces none of these)"
            )
            said += f" and keep {_shown(kept)}" if kept and replaced else ""
            raise ValueError(
                f"output folder {str(target)!r} is not empty ({_shown(entries)}); pass --overwrite "
                f"(overwrite=True) {said}, or choose an empty folder"
            )
    elif replaced and not reuse_own:
        logger.warning("%s: replacing %s (--overwrite)", target, _shown(replaced))
    return target


def _move_file(src: Path, dst: Path) -> None:
    """Move one file atomically onto ``dst``, copying first when they are on two filesystems."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(src, dst)
    except OSError as err:
        if err.errno != errno.EXDEV:
            raise
        tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
        shutil.copy2(src, tmp)
        os.replace(tmp, dst)
        src.unlink()


def _install_in_place(staged: Path, target: Path, owns: Sequence[str] | None) -> None:
    """Move ``staged``'s files into ``target`` one by one; owned files not rewritten go; marker last."""
    target.mkdir(parents=True, exist_ok=True)
    (target / MARKER).unlink(missing_ok=True)  # from here until the end target is "incomplete"
    new = _files(staged)
    new_tops = {name.split("/", 1)[0] for name in new}
    stale = [
        name for name in _files(target) if name not in new and (name.split("/", 1)[0] in new_tops or _owned(name, owns))
    ]
    for name in sorted(new):
        _move_file(staged / name, target / name)
    if stale:
        logger.warning(
            "%s: removing %s (written by an earlier run of this command, not by this one)", target, ", ".join(stale)
        )
    for name in stale:
        (target / name).unlink(missing_ok=True)
    _move_file(staged / MARKER, target / MARKER)
    shutil.rmtree(staged, ignore_errors=True)


def replace_directory(staged: str | os.PathLike, target: str | os.PathLike) -> Path:
    """Move the complete folder ``staged`` to ``target`` (same filesystem), replacing a previous one.

    Replacing takes two renames; a crash between them leaves the previous folder as
    ``.NAME.old-PID``, which `restore_orphan` puts back if it is complete.
    """
    staged, target = Path(staged), Path(target)
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        os.replace(target, old)
    try:
        os.replace(staged, target)
    except BaseException:
        if old is not None:
            os.replace(old, target)
        raise
    if old is not None:
        _remove_tree(old)
    return target


def restore_orphan(target: str | os.PathLike) -> None:
    """Put back a complete previous ``target`` that a crash between the two renames left hidden.

    A partial one (no marker, or files missing: a delete killed half-way) is never restored.
    """
    target = Path(target)
    if target.exists():
        return
    for orphan in sorted(target.parent.glob(f".{target.name}.old-*")):
        if verify_folder(orphan) is None:
            os.replace(orphan, target)
            return


@contextlib.contextmanager
def output_folder(
    path: str | os.PathLike,
    *,
    overwrite: bool = False,
    sources: Sequence[str | os.PathLike] = (),
    owns: Sequence[str] | None = None,
    keep_on_failure: bool = False,
) -> Iterator[Path]:
    """Yield an empty staging folder; on success its files become ``path``'s, the marker last.

    See the module docstring for the policy. An exception inside the block leaves ``path`` as it
    was and removes the staging folder.

    Args:
        path, overwrite, sources, owns: as for `check_output_dir`.
        keep_on_failure: when moving the finished files into ``path`` fails, keep the staging
            folder and name it in the error (a trained model is never deleted).

    Raises:
        ValueError: a refused output folder, before anything is written.
        OSError: the move failed (the error says where the finished files are).
    """
    target = check_output_dir(path, overwrite=overwrite, sources=sources, owns=owns)
    if target.is_symlink() and not target.exists():
        Path(os.path.realpath(target)).mkdir(parents=True)  # a dangling link: create what it points to
    target.parent.mkdir(parents=True, exist_ok=True)
    restore_orphan(target)
    clean_stale(target)
    in_place = target.is_symlink() or os.path.ismount(target) or (target.is_dir() and owns is not None)
    token = f"{os.getpid()}-{secrets.token_hex(4)}"
    # Inside OUT when writing in place: the staging folder is then on OUT's filesystem.
    staged = target / f"{_INPLACE_PREFIX}{token}" if in_place else target.with_name(f".{target.name}.tmp-{token}")
    os.mkdir(staged)
    try:
        yield staged
        _give_usual_mode(staged)
        write_marker(staged)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    try:
        if not in_place:
            try:
                replace_directory(staged, target)
                return
            except OSError as err:
                if err.errno not in _IN_PLACE_ERRNOS:
                    raise
                logger.info("%s cannot be renamed (%s): writing into it file by file", target, err.strerror)
        _install_in_place(staged, target, owns)
    except BaseException as err:
        if keep_on_failure:
            raise OSError(
                f"could not move the finished output into {str(target)!r} ({err}); "
                f"it is complete and kept in {str(staged)!r}"
            ) from err
        shutil.rmtree(staged, ignore_errors=True)
        raise


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike) -> Iterator[Path]:
    """A folder the caller owns whole (a cache, a fixture): `output_folder` replacing it."""
    with output_folder(path, overwrite=True) as staged:
        yield staged


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; write the file there, it is renamed onto ``path``.

    The temporary name holds the process id, so processes writing the same file (the ranks of a
    run filling one cache) never write into each other's temporary file.
    """
    target = Path(path)
    made = [folder for folder in target.absolute().parents if not folder.exists()]
    target.parent.mkdir(parents=True, exist_ok=True)
    clean_stale(target)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        _give_usual_mode(tmp)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        for folder in made:  # the folders made for the file, deepest first: a failed write leaves no empty one
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise


def same_file(first: str | os.PathLike, second: str | os.PathLike) -> bool:
    """Whether two paths name one file: the same path by any spelling or link, or hard links of one file."""
    if os.path.realpath(first) == os.path.realpath(second):
        return True
    try:
        return os.path.samefile(first, second)
    except OSError:  # one of them does not exist (yet): then only the spelling can make them one
        return False


def refuse_file_above(path: str | os.PathLike, what: str) -> None:
    """Refuse an output ``path`` under an existing file (``out.gguf/x``): no folder can be made there.

    Raises:
        ValueError: naming ``what``, the path and the file in the way.
    """
    for parent in Path(path).absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise ValueError(
                    f"{what} {str(path)!r} lies under {str(parent)!r}, which is a file, not a folder; "
                    "choose another path (nothing was written)"
                )
            return


def check_output_file(
    path: str | os.PathLike,
    *,
    sources: Sequence[str | os.PathLike] = (),
    overwrite: bool = False,
    what: str = "output file",
) -> Path:
    """Refuse a file the writer must not write; returns ``path`` as a Path (the rules of `output_file`).

    ``path`` may not be one of ``sources`` (by any spelling or link), a folder, under a file, or
    (without ``overwrite``) an existing file. ``what`` names it in the messages.

    Raises:
        ValueError: naming the file and what to do instead.
    """
    target = Path(path)
    for source in sources:
        if same_file(target, source):
            raise ValueError(f"{what} {str(target)!r} is the source {str(source)!r}; write to another file")
    if target.is_dir():
        raise ValueError(f"{what} {str(target)!r} is an existing folder; give a file path (nothing was written)")
    refuse_file_above(target, what)
    if target.exists() and not overwrite:
        raise ValueError(
            f"{what} {str(target)!r} exists; pass --overwrite (overwrite=True) to replace it, "
            "or choose another path (nothing was written)"
        )
    return target


@contextlib.contextmanager
def output_file(
    path: str | os.PathLike, *, sources: Sequence[str | os.PathLike] = (), overwrite: bool = False
) -> Iterator[Path]:
    """The output-folder policy for a single file: checked first (`check_output_file`), then `atomic_file`.

    Raises:
        ValueError: naming the file and what to do instead; nothing was written.
    """
    with atomic_file(check_output_file(path, sources=sources, overwrite=overwrite)) as tmp:
        yield tmp


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` atomically; returns ``path`` as a Path."""
    with atomic_file(path) as tmp:
        tmp.write_text(text)
    return Path(path)
