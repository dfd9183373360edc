"""`sme2-farm`: runs the whole farm on one machine (server, worker, beat, an agent) under a supervisor,
and administers it (migrations, tokens, runner builds, the SME2 emulator, the demo)."""
