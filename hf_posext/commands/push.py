"""``hf-posext push DIR REPO_ID``: upload an extended checkpoint to the Hub (``hf_posext.publish.hub.push_to_hub``).

    hf-posext push out/llama-2-7b-yarn-64k my-org/llama-2-7b-yarn-64k --dry-run  # list, upload nothing

The token comes from ``HF_TOKEN`` or ``hf auth login`` (no ``--token`` flag: it would end up in
shell history); only a model repository's files are sent unless ``--include``/``--all`` say more.
"""

from __future__ import annotations

import argparse

from .arguments import plain


def _push(args: argparse.Namespace) -> int:
    from ..publish.hub import push_to_hub

    result = push_to_hub(
        args.folder,
        args.repo_id,
        private=args.private,
        revision=args.revision,
        commit_message=args.commit_message,
        dry_run=args.dry_run,
        include=args.include,
        all_files=args.all,
    )
    for name in result.files:
        print(f"  {name}")
    if result.left_out:
        print(
            f"left out (not a model repository's files; --include PATTERN or --all to send them): "
            f"{', '.join(result.left_out)}"
        )
    if result.url is None:
        print(f"dry run: would upload {len(result.files)} files to {result.repo_id}")
    else:
        print(f"uploaded {len(result.files)} files to https://huggingface.co/{result.repo_id} ({result.url})")
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``hf-posext push``."""
    p = subparsers.add_parser(
        "push",
        help="upload an extended checkpoint to the Hugging Face Hub",
        description=plain(__doc__.split("\n\n")[0]),
    )
    p.add_argument("folder", help="checkpoint folder (from hf-posext finetune or hf-posext patch)")
    p.add_argument("repo_id", help="owner/name on the Hub")
    p.add_argument("--private", action="store_true", help="create the repository private")
    p.add_argument("--revision", default=None, help="branch to commit to (created if missing)")
    p.add_argument("--commit-message", default=None, help="default: what the checkpoint is (method, factor, context)")
    p.add_argument("--dry-run", action="store_true", help="list the files that would be uploaded, upload nothing")
    p.add_argument(
        "--include",
        action="append",
        default=[],
        metavar="PATTERN",
        help="also send files matching PATTERN, e.g. '*.ipynb' (repeatable)",
    )
    p.add_argument(
        "--all", action="store_true", help="send every file but hidden files, training states and temporaries"
    )
    p.set_defaults(func=_push)
