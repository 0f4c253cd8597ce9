"""What every layer above the model shares: `errors` (how a mistake reads: one line naming the flag, file or field),
`fileio` (every file a tool writes appears whole or not at all) and `flag_choices` (the tools' flag defaults and
choices, importing nothing)."""
