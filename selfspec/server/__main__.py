"""`python -m selfspec.server --model smollm2`: the same as `selfspec serve`."""

from selfspec.server.cli import main

if __name__ == "__main__":
    main()
