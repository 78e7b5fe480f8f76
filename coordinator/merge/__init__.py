"""``[merge]``: the coding members' patches applied together and tested (:mod:`.merge`)."""
