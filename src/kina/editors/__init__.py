"""Support for editors and terminals: `pygments_lexer.KinaLexer` highlights `.kina` files."""
