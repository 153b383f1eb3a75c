"""A travel guide to a small town: history, getting there, sights, food and tips. All names, places and
figures are invented by the facts function."""
from __future__ import annotations

import random

from benchmarks.prompts.documents import Genre, S
from benchmarks.prompts.text import people, surname, towns

_PLACES = (
    dict(kind="fishing harbour", setting="a sheltered bay on a rocky coast", old_trade="herring fishing",
         sight="the lighthouse on the northern headland", walk="the cliff path to the seal colony",
         food="grilled fish caught the same morning", season="late spring", crowd="August"),
    dict(kind="hill town", setting="a ridge above two wooded valleys", old_trade="charcoal burning and "
         "woodworking", sight="the ruined castle at the top of the town", walk="the old mule track down to the "
         "river", food="mushroom dishes and chestnut cake", season="autumn", crowd="the October festival"),
    dict(kind="lake village", setting="the northern shore of a long glacial lake", old_trade="boat building",
         sight="the floating market held on summer weekends", walk="the lakeside trail to the waterfall",
         food="smoked lake trout and rye bread", season="early summer", crowd="July"),
    dict(kind="island town", setting="the only sheltered harbour of a small island", old_trade="salt "
         "production", sight="the salt pans that are still worked by hand", walk="the coastal loop past three "
         "small beaches", food="seafood stews flavoured with island herbs", season="September",
         crowd="the peak summer weeks"),
    dict(kind="market town", setting="a wide river plain surrounded by orchards", old_trade="the fruit trade",
         sight="the covered market and its painted clock tower", walk="the orchard trail that follows the old "
         "canal", food="apple pastries and cider", season="blossom time in April", crowd="market days"),
    dict(kind="mountain village", setting="the head of a high alpine valley", old_trade="dairy farming and "
         "cheese making", sight="the wooden chapel above the village", walk="the path to the high pastures and "
         "the glacier viewpoint", food="mountain cheese and hearty soups", season="June and September",
         crowd="the school holidays"),
    dict(kind="river port", setting="a bend in a wide navigable river", old_trade="grain shipping",
         sight="the old warehouses along the quay, now full of galleries", walk="the towpath to the lock and "
         "back along the far bank", food="river fish with dill and new potatoes", season="early autumn",
         crowd="the summer regatta weekend"),
    dict(kind="spa town", setting="a wooded valley with warm springs", old_trade="its healing waters",
         sight="the domed bathhouse and its tiled pools", walk="the forest trail to the hilltop tower",
         food="honey cakes and hearty game stews", season="late spring", crowd="the long holiday weekends"),
    dict(kind="wine village", setting="south-facing slopes above a slow river", old_trade="wine making",
         sight="the cellars cut deep into the hillside", walk="the vineyard path to the neighbouring villages",
         food="local cheese, smoked ham and the new wine", season="the harvest weeks of September",
         crowd="the wine festival weekend"),
    dict(kind="border town", setting="both banks of a river that marks the frontier", old_trade="customs duties "
         "and cross-border markets", sight="the old bridge with its customs house", walk="the riverside path "
         "along the old fortifications", food="dishes that mix the cooking of both countries", season="May",
         crowd="the Saturday market"),
)


def _travel_facts(rng: random.Random, topic: dict) -> dict:
    guide, owner, baker = people(rng, 3)
    name, city = towns(rng, 2)
    return dict(topic, name=name, city=city, guide=guide, guide_s=surname(guide), owner=owner,
                baker=baker, hours=rng.choice(("two", "three", "four")), km=rng.randint(6, 24),
                pop=f"{rng.randint(900, 14000):,}", founded=rng.choice(("twelfth", "thirteenth", "fourteenth",
                "sixteenth")), rooms=rng.randint(6, 40), buses=rng.randint(2, 9), museum_day=rng.choice(
                ("Monday", "Tuesday", "Wednesday")))


TRAVEL = Genre("travel guide", "{name}: a traveller's guide to a {kind}", _PLACES, _travel_facts, (
    S(("{name} is a {kind} of about {pop} people, built on {setting}.",
       "Set on {setting}, {name} is a {kind} with a population of around {pop}."),
      ("It is the kind of place that many visitors discover by accident and then return to year after year.",
       "Few travellers plan to come here the first time, but many come back."),
      ("This guide covers how to get there, what to see and eat, and when to visit.",
       "Below you will find practical advice on getting there, the main sights, food and the best time to "
       "come.")),
    S(("The town dates from the {founded} century and grew rich on {old_trade}.",
       "{name} was founded in the {founded} century, and for most of its history it lived from {old_trade}."),
      ("That trade has almost disappeared, but it shaped the streets, the buildings and the town's festivals.",
       "Little of that trade survives today, but its traces are everywhere, from street names to the local "
       "dialect."),
      ("Local guide {guide} says that understanding this past is the key to enjoying the town.",
       "{guide}, who leads walking tours, likes to say that every old house in {name} has a story about "
       "{old_trade}.")),
    S(("The easiest way to arrive is by train to {city}, followed by a bus ride of about {hours} hours.",
       "Most visitors travel by rail to {city} and continue by bus, a journey of roughly {hours} hours."),
      ("There are {buses} buses a day in summer and fewer in winter, so check the timetable before you set out.",
       "Buses run {buses} times a day in the main season; outside it, services are reduced."),
      ("Driving is possible, but parking in the old centre is limited, and the narrow streets are not suited to "
       "large cars.",
       "If you drive, leave the car at the car park outside the old centre, which is largely closed to "
       "traffic.")),
    S(("The main sight is {sight}.", "No visit is complete without {sight}."),
      ("It is best seen early in the morning, before the tour groups arrive, or in the soft light of early "
       "evening.",
       "Go early or late in the day to avoid the crowds and to see it at its most atmospheric."),
      ("The small town museum explains the history well and is closed on {museum_day}s.",
       "The town museum, closed on {museum_day}s, is small but worth an hour."),
      ("Many of the best corners, however, are simply the side streets, the courtyards and the views that open "
       "up unexpectedly between houses.",
       "Leave time simply to wander: some of the most memorable moments come in quiet side streets.")),
    S(("For walkers, the highlight is {walk}, a route of about {km} kilometres.",
       "Keen walkers should not miss {walk}, roughly {km} kilometres in total."),
      ("It is well marked and suitable for most reasonably fit visitors, though good shoes are essential.",
       "The route is waymarked and not technically difficult, but sturdy footwear is a must."),
      ("Take water and a snack, as there are few places to buy anything along the way.",
       "There is nowhere to buy food on the way, so bring supplies.")),
    S(("The calendar is full of local events.", "Festivals play a big part in the life of {name}."),
      ("The most important is the summer festival, which celebrates the town's history with music, processions "
       "and a communal meal in the main square.",
       "The biggest event is a summer festival with a procession, live music and long tables set up in the "
       "streets."),
      ("In winter, a small lantern parade lights up the old streets on the longest night of the year.",
       "A candlelit parade on the shortest day of the year is quieter but, for many, even more memorable."),
      ("A weekly market brings farmers from the surrounding area into town every Saturday morning.",
       "Every Saturday there is a farmers' market, which is the best place to buy local produce.")),
    S(("If you have an extra day, there are good excursions nearby.", "{name} also makes a good base for day "
       "trips."),
      ("{city} is within easy reach by bus and has a fine old quarter and several museums.",
       "The larger town of {city} is an easy trip and offers museums and better shopping."),
      ("Closer to hand, the surrounding villages are linked by quiet lanes that are ideal for cycling, and bikes "
       "can be hired in the main square.",
       "Bicycles can be rented in town, and the quiet lanes that connect the neighbouring villages are perfect "
       "for a relaxed ride."),
      optional=True),
    S(("The local speciality is {food}.", "Food here is simple and excellent, and the thing to try is {food}."),
      ("The family-run inn near the harbour square, owned by {owner}, is a reliable choice for dinner.",
       "{owner}'s small restaurant near the main square serves the best version in town, according to locals."),
      ("For breakfast, follow the smell of fresh bread to the bakery run by {baker}, which opens at six.",
       "Early risers should visit {baker}'s bakery, which sells out of its best pastries by nine."),
      ("Prices are noticeably lower than in the cities, and portions are generous.",
       "Eating out is good value, and tipping is appreciated but not expected.")),
    S(("Accommodation is limited, with around {rooms} guest houses and small hotels.",
       "There are only about {rooms} places to stay, mostly small family-run guest houses."),
      ("Book well ahead for summer weekends, when rooms can be scarce.",
       "In the busy season it is wise to reserve several weeks in advance."),
      ("Some farms outside town also offer rooms, which can be a peaceful alternative if you have a car.",
       "Farm stays in the surrounding countryside offer a quieter alternative."),
      optional=True),
    S(("The best time to visit is {season}, when the weather is mild and the town is calm.",
       "Come in {season} if you can: the weather is usually pleasant and the streets are quiet."),
      ("Avoid {crowd} unless you enjoy crowds, as the town fills up and prices rise.",
       "The busiest period is {crowd}, when accommodation is hard to find."),
      ("Whenever you come, slow down: {name} rewards visitors who stay a few days rather than a few hours.",
       "Above all, give yourself time; {name} is a place to stay in, not to tick off.")),
    S(("A few practical tips complete the picture.", "Finally, some practical points."),
      ("Many small shops still prefer cash, and the only cash machine is at the post office.",
       "Carry some cash, since smaller shops and cafés do not always accept cards."),
      ("Mobile reception is patchy on the walking routes, so download maps before you set out.",
       "Download offline maps before heading out on foot, as the signal is unreliable outside the town."),
      ("Shops close for a long lunch, and almost everything is shut on Sunday afternoons.",
       "Expect most shops to close in the early afternoon and on Sundays."),
      optional=True),
))
