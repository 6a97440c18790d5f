"""The `dblp-testbed` command line."""
import click


@click.group()
def main():
    """Emulated fat-tree testbed for bounded-loss gradient transports."""
