"""The ten document genres of the summarization inputs (also the English translation sources), one
module each; the order of GENRES is the order in which summarization cycles through them."""
from benchmarks.prompts.genres import history, incident, memo, minutes, news, profile, quarterly, review, study, travel

GENRES = (news.NEWS, minutes.MINUTES, memo.MEMO, history.HISTORY, quarterly.QUARTER, incident.INCIDENT,
          review.REVIEW, study.STUDY, profile.PROFILE, travel.TRAVEL)
