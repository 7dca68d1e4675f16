"""Client selection policies: random, Oort, Power-of-Choice, TiFL."""
