"""A long product review: design, setup, everyday use, flaws, price and verdict. All names, places and
figures are invented by the facts function."""
from __future__ import annotations

import random

from benchmarks.prompts.documents import Genre, S
from benchmarks.prompts.text import firm, people

_PRODUCTS = (
    dict(product="e-reader", a_product="an e-reader", model_word="reader", battery=(3, 8, "weeks"),
         price=(90, 260), grams=(170, 240), strength="the sharp, glare-free screen",
         weakness="the slow page turns in large PDF files", use="reading in bed and on trains",
         rival="the market leader's basic model"),
    dict(product="espresso machine", a_product="an espresso machine", model_word="machine", battery=None,
         price=(250, 1400), grams=(3800, 9500), strength="the fast heat-up and stable temperature",
         weakness="the small drip tray that needs emptying every day", use="two or three coffees each morning",
         rival="manual lever machines at a similar price"),
    dict(product="electric cargo bike", a_product="an electric cargo bike", model_word="bike",
         battery=(45, 110, "kilometres"), price=(2400, 6900), grams=(29000, 46000),
         strength="the smooth motor and low centre of gravity", weakness="its weight when the battery is flat",
         use="school runs and weekly shopping", rival="a small second car"),
    dict(product="pair of noise-cancelling headphones", a_product="a pair of noise-cancelling headphones",
         model_word="headphones", battery=(22, 40, "hours"), price=(120, 480), grams=(220, 330),
         strength="the effective cancellation of low engine noise", weakness="the tight fit on larger heads",
         use="commuting and long flights", rival="last year's flagship from the same brand"),
    dict(product="robot vacuum", a_product="a robot vacuum", model_word="robot", battery=(70, 160, "minutes"),
         price=(240, 1100), grams=(2900, 4400), strength="the accurate room mapping",
         weakness="the way it gets stuck under low sofas", use="daily cleaning in a flat with a dog",
         rival="a good cordless stick vacuum"),
    dict(product="portable projector", a_product="a portable projector", model_word="projector",
         battery=(2, 4, "hours"), price=(280, 950), grams=(800, 2100), strength="the bright image for its size",
         weakness="the fan noise in quiet scenes", use="film nights in the garden and presentations",
         rival="a mid-range television"),
    dict(product="smartwatch", a_product="a smartwatch", model_word="watch", battery=(2, 9, "days"),
         price=(180, 520), grams=(32, 58), strength="the accurate heart-rate and sleep tracking",
         weakness="notifications that arrive a few seconds late", use="running and keeping an eye on messages",
         rival="a basic fitness band"),
    dict(product="air purifier", a_product="an air purifier", model_word="purifier", battery=None,
         price=(140, 600), grams=(3200, 7800), strength="the almost silent night mode",
         weakness="the cost of replacement filters", use="a bedroom in a city flat",
         rival="a cheaper model without an air quality sensor"),
    dict(product="compact camera", a_product="a compact camera", model_word="camera",
         battery=(250, 450, "shots"), price=(450, 1300), grams=(240, 420),
         strength="the sharp lens and natural colours", weakness="the slow autofocus in dim light",
         use="travel photography", rival="a flagship smartphone"),
    dict(product="electric toothbrush", a_product="an electric toothbrush", model_word="toothbrush",
         battery=(2, 5, "weeks"), price=(40, 230), grams=(110, 160), strength="the gentle but thorough "
         "cleaning modes", weakness="the loud buzzing at the highest setting", use="brushing twice a day at "
         "home and on trips", rival="a good manual toothbrush"),
)


def _power_lines(rng: random.Random, battery: tuple | None) -> dict:
    """The battery paragraph's product-specific sentences (mains-powered products have no battery)."""
    if battery is None:
        return dict(power_line="There is no battery, of course, and the power it draws in standby is "
                    "negligible.",
                    charge_line="Energy use seems modest, although I did not measure it precisely.")
    lo, hi, unit = battery
    amount = rng.randint(lo, hi)
    return dict(power_line=rng.choice((f"Battery life was about {amount} {unit} in my testing, close to the "
                                       "official figure.",
                                       f"In my testing the battery lasted roughly {amount} {unit}, in line with "
                                       "the manufacturer's claim.")),
                charge_line=rng.choice(("Charging is reasonably quick, and the charger is included in the box.",
                                        "The charger and cable are included, which is no longer something to "
                                        "take for granted.")))


def _weight(grams: int) -> str:
    return f"{grams} grams" if grams < 2000 else f"{grams / 1000:.1f} kilograms"


def _review_facts(rng: random.Random, topic: dict) -> dict:
    reviewer, partner = people(rng, 2)
    name = rng.choice(("Aria", "Nova", "Pulse", "Vista", "Orbit", "Halo", "Tempo", "Drift")) + f" {rng.randint(2, 9)}"
    return dict(topic, **_power_lines(rng, topic["battery"]), brand=firm(rng).split()[0], name=name,
                price=f"{rng.randrange(*topic['price'], 10):,} euros", weight=_weight(rng.randint(*topic['grams'])),
                weeks=rng.randint(3, 8), reviewer=reviewer, partner=partner,
                score=rng.choice(("three", "four", "three and a half", "four and a half")),
                setup_min=rng.randint(5, 40))


REVIEW = Genre("product review", "Review: {brand} {name}, {a_product} for {use}", _PRODUCTS, _review_facts, (
    S(("I spent {weeks} weeks with the {brand} {name}, {a_product} that costs {price} and promises to make "
       "{use} easier.",
       "The {brand} {name} is {a_product} priced at {price}, aimed squarely at people who want something "
       "reliable for {use}."),
      ("I used it every day, in the way most owners would, rather than running laboratory tests.",
       "My testing was practical rather than scientific: I simply used it every day for {weeks} weeks."),
      ("The short version is that it does most things well, with one or two frustrations that may matter more "
       "to some buyers than to others.",
       "It is a good product with a couple of flaws, and whether those flaws matter depends on how you plan to "
       "use it.")),
    S(("Out of the box, the {model_word} feels solid and carefully made.",
       "First impressions are good: the {model_word} is well finished and feels sturdier than its price "
       "suggests."),
      ("At {weight} it is neither the lightest nor the heaviest in its class.",
       "It weighs {weight}, which is about average for this kind of product."),
      ("The materials are mostly matte plastic and metal, and nothing rattled or creaked during testing.",
       "There is a little too much glossy plastic for my taste, but the build quality is reassuring."),
      ("The packaging is almost entirely recyclable cardboard, which is a welcome change.",
       "It comes in plain cardboard packaging with very little plastic.")),
    S(("Setting it up took about {setup_min} minutes, most of which was spent on a software update.",
       "Setup took me {setup_min} minutes, including a firmware update that started automatically."),
      ("The companion app is clear, although it asks for more permissions than it really needs.",
       "The app walks you through the process sensibly, but it insists on creating an account, which I found "
       "unnecessary."),
      ("The printed instructions are brief, and I had to look online for the answer to one question.",
       "The included manual is short, so first-time owners may need to consult the online help pages.")),
    S(("In everyday use, the highlight is {strength}.", "What impressed me most was {strength}."),
      ("Over the weeks of testing it quickly became something I relied on rather than something I was "
       "reviewing.",
       "It took only a few days before I stopped thinking about it and simply used it."),
      ("{partner}, who shared it with me for part of the test, was equally positive and found it easy to learn.",
       "I also asked {partner} to try it without any explanation, and they worked out the basics in minutes.")),
    S(("The software deserves a mention of its own.", "Software matters more than ever in products like this."),
      ("Settings are grouped sensibly, and the features most people need are never more than two taps away.",
       "The menus are logical, and the defaults are sensible enough that many owners will never change them."),
      ("There are a few gimmicks I never used, such as a social sharing feature and an overly chatty voice "
       "assistant.",
       "Some extras feel unnecessary, including a voice assistant that interrupts more often than it helps."),
      ("The manufacturer promises updates for at least four years, which is better than most competitors offer.",
       "Updates are promised for four years, a commitment that compares well with rival brands."),
      ("Privacy settings are easy to find, and the device works without sending usage data if you switch that "
       "option off.",
       "You can turn off data collection during setup, and the product works perfectly well without it.")),
    S(("Noise and comfort are easy to overlook in reviews, so I paid attention to both.",
       "A few practical details are worth mentioning."),
      ("It is quiet in normal use, and the controls give clear feedback without being stiff.",
       "It runs quietly, and the controls have a satisfying, positive feel."),
      ("After several weeks there are no visible signs of wear, apart from a few fingerprints on the glossy "
       "parts.",
       "It still looks new after weeks of daily use, which suggests the finish is durable."),
      optional=True),
    S(("It is not perfect, and the biggest annoyance is {weakness}.",
       "The main weakness is {weakness}."),
      ("This is not a deal-breaker, but it happened often enough to become irritating.",
       "It is the kind of problem that seems minor at first and grows more annoying with time."),
      ("A software update during testing improved things slightly, and the manufacturer says more fixes are "
       "coming.",
       "The manufacturer told me it is aware of the issue and plans to address it in a future update.")),
    S("{power_line}", "{charge_line}",
      ("Over the weeks of testing I never felt the need to plan my day around it.",
       "In practice, this was never a limitation for me."),
      optional=True),
    S(("At {price}, it sits in the middle of the market.", "The price of {price} is fair but not a bargain."),
      ("The obvious alternative is {rival}, which costs a little less but lacks some of the features I came to "
       "like.",
       "Buyers will inevitably compare it with {rival}, and the choice between them comes down to priorities."),
      ("If you can find it on sale, it becomes much easier to recommend.",
       "It is often discounted, and at a lower price it would be an easy recommendation.")),
    S(("The warranty covers two years, and spare parts are available directly from the manufacturer.",
       "Repairability is better than average: the manufacturer sells spare parts and publishes repair guides."),
      ("That matters, because a product like this should last for many years.",
       "Given the price, I would expect it to last at least five years, and the parts policy makes that more "
       "likely."),
      optional=True),
    S(("So, should you buy it?", "Who is it for?"),
      ("If your main concern is {use}, the {name} is an excellent choice, and its strengths outweigh its flaws.",
       "For anyone who mainly wants {a_product} for {use}, it is easy to recommend despite its flaws."),
      ("If {weakness} would bother you, it is worth waiting for the next version or looking at {rival}.",
       "Those who would be bothered by {weakness} should look elsewhere."),
      ("My score: {score} stars out of five.", "Overall rating: {score} out of five.")),
))
