"""What members spend: the run's one budget and the usage each call reports.

:mod:`.budget` reserves, holds and settles the run's token and dollar line across every
member (admission included); :mod:`.usage` sums the API's usage over a member's calls and
prices it with the model's rates.
"""
