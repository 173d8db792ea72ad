"""``testbed image build``: worker images for backend: docker, and the guest of backend: vm."""

from __future__ import annotations

import typer

from testbed.cli.params import Group, JsonOpt
from testbed.cli.render import emit, guard, plain, sayer

app = typer.Typer(cls=Group, no_args_is_help=True, rich_markup_mode=None,
                  help="Worker images for backend: docker (and the guest of backend: vm).")


@app.command("build")
def image_build(
    tag: str = typer.Option("testbed/worker:cpu", "--tag", metavar="TAG", help="Image tag to build."),
    force: bool = typer.Option(False, "--force", help="Rebuild the last step even if the content key matches."),
    vm: bool = typer.Option(False, "--vm", help="Build the guest of backend: vm instead (Debian's kernel, "
                            "fetched once with apt-get download, and a busybox initramfs)."),
    as_json: bool = JsonOpt,
):
    """Build the CPU worker image offline (debootstrap + pinned torch + workloads; cached by content)."""
    with guard(as_json):
        if vm:
            from testbed.nodes import vmimage

            res = vmimage.build(say=sayer(as_json), force=force)
            if as_json:
                emit(res)
            else:
                plain(f"VM guest: kernel {res['kernel']}, initramfs {res['initrd']} "
                      f"({'cached' if res['cached'] else 'built'} in {res['seconds']:.1f} s)")
            return
        from testbed.nodes.images import build

        res = build(tag, say=sayer(as_json), force=force)
        if as_json:
            emit(res)
        else:
            plain(f"{res['tag']}: {res['id'][:19]} ({'cached' if res['cached'] else 'built'} in "
                  f"{res['seconds']:.1f} s)")
