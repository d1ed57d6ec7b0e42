"""`python -m multiagenttrainer.cli`: the same as the `mat` command."""

from multiagenttrainer.cli import main

main()
