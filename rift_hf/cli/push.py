"""`rift-hf push`: check a drafter folder (it loads in plain transformers) and upload it to the Hub (`rift_hf.hub`)."""

from __future__ import annotations

from pathlib import Path

HELP = "check a drafter folder (loads in plain transformers) and upload it to the Hub"


def add_arguments(parser) -> None:
    parser.add_argument("folder", type=Path, help="the drafter folder, e.g. <train out>/model")
    parser.add_argument("repo_id", help="Hub model repository, e.g. you/qwen2.5-coder-0.5b-rift")
    parser.add_argument("--private", action="store_true", help="create the repository private")
    parser.add_argument("--dry-run", action="store_true", help="run the checks only; upload nothing")
    parser.add_argument(
        "--custom-generate",
        action="store_true",
        help="also add custom_generate/ (rift as a Hub-hosted generation method, the package copied in): users run "
        "generate(custom_generate=REPO_ID, trust_remote_code=True) without installing rift-hf",
    )


def run(parser, args) -> None:
    from ..hub import push, write_custom_generate

    try:
        if args.custom_generate:
            if not args.folder.is_dir():
                raise ValueError(f"{args.folder} is not a folder")
            if args.dry_run:  # a dry run writes nothing, not even into the folder
                print(f"would write {args.folder / 'custom_generate'} (dry run: not written)")
            else:
                print(f"wrote {write_custom_generate(args.folder, args.repo_id)}")
        url = push(args.folder, args.repo_id, private=args.private, dry_run=args.dry_run)
    except (ValueError, RuntimeError) as err:
        parser.exit(2, f"rift-hf push: {err}\n")
    except Exception as err:  # the Hub: no network, no token, no rights
        parser.exit(1, f"rift-hf push: upload to {args.repo_id} failed: {type(err).__name__}: {err}\n")
    print(f"{args.folder}: ready to publish (dry run)" if url is None else f"uploaded: {url}")
