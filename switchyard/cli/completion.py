"""``switchyard completion bash|zsh``: a shell completion script for every command, subcommand and
flag, generated from the parser itself (so it never lags behind a new flag). No argcomplete needed:
the script is static; ``eval "$(switchyard completion bash)"`` in ~/.bashrc (zsh: the same with
``zsh``, which loads bash's completion support first)."""

from __future__ import annotations

import argparse
import shlex

from switchyard.cli.options import show

EMPTY = '""'  # the top level's path in a case arm
ZSH_PRELUDE = "autoload -U +X bashcompinit && bashcompinit\n"
BASH_DRIVER = r"""
_switchyard() {
    local cur="${COMP_WORDS[COMP_CWORD]}" path="" word i
    for ((i = 1; i < COMP_CWORD; i++)); do
        word="${COMP_WORDS[i]}"
        case " $(_switchyard_subcommands "$path") " in
            *" $word "*) path="${path:+$path }$word" ;;
        esac
    done
    COMPREPLY=($(compgen -W "$(_switchyard_subcommands "$path") $(_switchyard_flags "$path")" -- "$cur"))
}
complete -o default -F _switchyard switchyard
"""


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(actions[0].choices) if actions else {}


def _tree(parser: argparse.ArgumentParser, path: str = "") -> dict[str, tuple[list[str], list[str]]]:
    """Command path ("" for the top, "pool status") -> its subcommands and its flags."""
    children = _subparsers(parser)
    flags = [s for a in parser._actions for s in a.option_strings if s.startswith("--") or len(s) == 2]
    tree = {path: (sorted(children), sorted(set(flags)))}
    for name, child in children.items():
        tree.update(_tree(child, f"{path} {name}".strip()))
    return tree


def _case(function: str, entries: dict[str, list[str]]) -> str:
    arms = "".join(f"        {shlex.quote(path) if path else EMPTY}) echo {shlex.quote(' '.join(words))} ;;\n"
                   for path, words in entries.items() if words)
    return f"{function}() {{\n    case \"$1\" in\n{arms}    esac\n}}\n"


def script(root: argparse.ArgumentParser, shell: str) -> str:
    """The completion script of ``root``'s command tree for ``shell`` (bash or zsh)."""
    tree = _tree(root)
    body = (_case("_switchyard_subcommands", {p: subs for p, (subs, _) in tree.items()})
            + _case("_switchyard_flags", {p: flags for p, (_, flags) in tree.items()}) + BASH_DRIVER)
    return (ZSH_PRELUDE if shell == "zsh" else "") + body


def register(subparsers: argparse._SubParsersAction) -> None:
    completion = subparsers.add_parser(
        "completion", help="print a shell completion script (bash or zsh)",
        description='Print the completion script of every command and flag. Bash: eval "$(switchyard '
                    'completion bash)" in ~/.bashrc; zsh: eval "$(switchyard completion zsh)" in ~/.zshrc.')
    completion.add_argument("shell", choices=("bash", "zsh"), help="the shell to complete in")

    def cmd_completion(args: argparse.Namespace) -> int:
        # the top: its subcommands (every registered one, by now) and the flags they all share
        top = argparse.ArgumentParser(prog="switchyard", add_help=True)
        top.add_argument("--version", action="store_true")
        top_sub = top.add_subparsers()
        top_sub.choices.update(subparsers.choices)
        show(*script(top, args.shell).splitlines())  # plain lines: nothing in them to escape
        return 0

    completion.set_defaults(func=cmd_completion)
