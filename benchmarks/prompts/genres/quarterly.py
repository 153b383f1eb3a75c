"""A quarterly business update: results, segments, costs, outlook and reactions. All names, places and
figures are invented by the facts function."""
from __future__ import annotations

import random

from benchmarks.prompts.documents import Genre, S
from benchmarks.prompts.text import MONTHS, WEEKDAYS, firm, people, surname, town

_SECTORS = (
    dict(sector="refrigerated logistics", tail="Logistics", core="temperature-controlled delivery for supermarkets",
         new_line="a same-day pharmacy delivery service", cost="diesel and vehicle maintenance",
         risk="the loss of a single large supermarket contract", asset="the new distribution hub"),
    dict(sector="agricultural robotics", tail="Robotics", core="weeding robots leased to vegetable farms",
         new_line="a drone service that maps crop health", cost="batteries and imported sensors",
         risk="a poor harvest season that delays farmers' investment decisions", asset="the expanded assembly line"),
    dict(sector="plant-based foods", tail="Foods", core="oat and pea based dairy alternatives",
         new_line="a range of ready meals for school canteens", cost="oats, packaging and energy for the plant",
         risk="retailers cutting shelf space for the whole category", asset="the second production line"),
    dict(sector="hospital software", tail="Health", core="scheduling software for operating theatres",
         new_line="a patient messaging app", cost="cloud hosting and the support team",
         risk="public hospitals delaying purchases because of budget pressure", asset="the new data centre region"),
    dict(sector="residential solar", tail="Energy", core="rooftop solar installations for homeowners",
         new_line="home battery systems paired with existing panels", cost="panels, inverters and installer wages",
         risk="changes to the feed-in tariff that homeowners receive", asset="the new training academy for "
         "installers"),
    dict(sector="outdoor clothing", tail="Outfitters", core="waterproof jackets and hiking boots",
         new_line="a repair and resale programme for used gear", cost="technical fabrics and freight",
         risk="another warm, dry autumn that depresses sales of winter lines", asset="the flagship repair "
         "workshop"),
    dict(sector="bicycle components", tail="Cycles", core="gears and brakes supplied to bicycle makers",
         new_line="a range of parts for electric cargo bikes", cost="aluminium and shipping",
         risk="a continued slump in bicycle sales after the pandemic boom", asset="the automated machining hall"),
    dict(sector="language-learning apps", tail="Learning", core="subscriptions to its mobile language courses",
         new_line="live online classes with tutors", cost="marketing and tutor fees",
         risk="free alternatives built on AI chat tools", asset="the new content studio"),
    dict(sector="specialty coffee", tail="Roasters", core="roasted coffee sold to cafés and restaurants",
         new_line="a subscription service for home customers", cost="green coffee beans and energy",
         risk="another sharp rise in the price of green coffee", asset="the larger roasting plant"),
    dict(sector="industrial sensors", tail="Instruments", core="vibration sensors for factory machinery",
         new_line="software that predicts machine failures", cost="microchips and engineering salaries",
         risk="shortages of the microchips its sensors depend on", asset="the new test laboratory"),
)


def _quarter_facts(rng: random.Random, topic: dict) -> dict:
    ceo, cfo, analyst = people(rng, 3)
    growth = rng.randint(3, 24)
    sector = topic
    return dict(sector, company=firm(rng, sector["tail"]), ceo=ceo, ceo_s=surname(ceo), cfo=cfo, cfo_s=surname(cfo),
                analyst=analyst, quarter=rng.choice(("first", "second", "third", "fourth")),
                year=rng.randint(2024, 2027), revenue=f"{rng.uniform(18, 420):.1f}", growth=growth,
                core_share=rng.randint(58, 84), new_growth=rng.randint(35, 160), margin=rng.randint(6, 19),
                margin_prev=rng.randint(4, 17), cash=f"{rng.uniform(8, 95):.1f}", hires=rng.randint(12, 140),
                customers=f"{rng.randint(140, 9800):,}", guidance_lo=growth + rng.randint(-2, 2),
                guidance_hi=growth + rng.randint(3, 7), hq=town(rng), weekday=rng.choice(WEEKDAYS),
                month=rng.choice(MONTHS), cur=rng.choice(("euros", "dollars", "pounds")))


QUARTER = Genre("quarterly business update", "{company}: results for the {quarter} quarter of {year}", _SECTORS,
                _quarter_facts, (
    S(("{company}, the {hq}-based specialist in {sector}, reported revenue of {revenue} million {cur} for the "
       "{quarter} quarter of {year}, up {growth} percent on the same period a year earlier.",
       "Revenue at {company} rose {growth} percent year on year to {revenue} million {cur} in the {quarter} quarter of "
       "{year}, the company said on {weekday}."),
      ("The result was slightly ahead of the company's own forecast and reflected steady demand in its main "
       "business.",
       "Management described the quarter as solid rather than spectacular, with growth coming mostly from "
       "existing customers."),
      ("Operating margin improved to {margin} percent from {margin_prev} percent a year ago.",
       "The operating margin came in at {margin} percent, compared with {margin_prev} percent in the same quarter "
       "last year.")),
    S(("The core business, {core}, still accounts for about {core_share} percent of revenue.",
       "Roughly {core_share} percent of revenue continues to come from {core}."),
      ("Volumes there grew modestly, while prices held up better than expected despite strong competition.",
       "Growth in the core business came mainly from higher volumes, as the company chose not to raise prices "
       "this quarter."),
      ("The company now serves {customers} customers, and renewal rates remained high.",
       "Its customer base has grown to {customers}, and very few customers left during the quarter.")),
    S(("The fastest-growing part of the business was {new_line}, launched eighteen months ago.",
       "Much of the attention went to {new_line}, which the company started a year and a half ago."),
      ("Revenue from the new line grew {new_growth} percent, although it remains small and is not yet profitable.",
       "Its revenue jumped {new_growth} percent, but it still makes a loss and represents a small share of the "
       "total."),
      ("Chief executive {ceo} said the company would keep investing in it for at least two more years before "
       "expecting a profit.",
       "{ceo}, the chief executive, said it was too early to judge the new line on profit and that investment would "
       "continue.")),
    S(("Performance differed by region.", "The picture varied across the company's markets."),
      ("Sales in the home market grew in line with the group as a whole, helped by two new contracts signed at "
       "the start of the quarter.",
       "The home market delivered steady growth, supported by contracts signed earlier in the year."),
      ("Exports were weaker, as a stronger currency made the company's offer more expensive for foreign buyers.",
       "Export revenue was flat, held back by currency movements and longer sales cycles abroad."),
      ("The company opened a small sales office in a neighbouring country and expects it to contribute from "
       "next year.",
       "A new sales office abroad opened during the quarter, although it has not yet generated meaningful "
       "revenue."),
      ("Management said it would rather grow carefully abroad than chase volume at low margins.",
       "{ceo_s} said expansion abroad would remain gradual and selective.")),
    S(("On strategy, the company confirmed it is looking at small acquisitions that would add technology or "
       "skills rather than revenue.",
       "The company said it remains open to small acquisitions, particularly of firms with skills it lacks."),
      ("No deal is currently under negotiation, and any purchase would be paid for in cash.",
       "Management stressed that no talks are under way and that it would not overpay."),
      ("It also announced a partnership with a university research group to develop the next generation of its "
       "products.",
       "A research partnership with a local university was also announced, focused on longer-term product "
       "development."),
      optional=True),
    S(("Costs rose in several areas, especially {cost}.", "Cost pressure remained, above all in {cost}."),
      ("Chief financial officer {cfo} said these increases had been partly offset by better planning and longer "
       "supplier contracts.",
       "According to finance chief {cfo}, longer contracts with suppliers and tighter planning absorbed part of "
       "the increase."),
      ("The company hired {hires} people during the quarter, mostly in operations and customer support.",
       "Headcount grew by {hires}, with most new staff joining operations and support teams."),
      ("{cfo_s} added that hiring would slow in the second half of the year.",
       "{cfo_s} said the pace of hiring would now ease.")),
    S(("Cash and short-term investments stood at {cash} million {cur} at the end of the quarter.",
       "The balance sheet remains strong, with {cash} million {cur} in cash and short-term deposits."),
      ("Capital spending was dominated by {asset}, which is due to open next year.",
       "Most capital spending went into {asset}, which should be completed next year."),
      ("The company has no plans to raise new equity and said it could fund its investments from its own cash "
       "flow.",
       "Management repeated that it expects to finance its plans without raising new capital.")),
    S(("Looking ahead, the company expects full-year revenue growth of between {guidance_lo} and {guidance_hi} "
       "percent.",
       "For the full year, {company} now forecasts revenue growth in the range of {guidance_lo} to {guidance_hi} "
       "percent."),
      ("The main risk it highlighted was {risk}.", "It named {risk} as the biggest risk to that outlook."),
      ("{ceo_s} said the company was prepared for a weaker economy but saw no sign of one in its order books.",
       "{ceo_s} said order books gave no sign of a slowdown but that the company had prepared for one anyway.")),
    S(("Analysts gave the results a cautious welcome.", "Reaction from analysts was broadly positive."),
      ("{analyst}, who follows the company for a regional investment bank, said the margin improvement was "
       "encouraging but that the new business still had to prove itself.",
       "{analyst}, an analyst at a regional bank, called the quarter reassuring while warning that expectations "
       "for the new business were high."),
      ("Some investors had hoped for a stronger forecast and said the company was being conservative.",
       "A few investors questioned whether the outlook was too conservative given the strength of the first half "
       "of the year."),
      optional=True),
    S(("The company also reported progress on its environmental targets.",
       "The update included a section on sustainability."),
      ("Energy use per unit of output fell for the third quarter in a row, and the share of electricity from "
       "renewable sources passed two thirds.",
       "It said energy consumption per unit of output had fallen again and that most of its electricity now came "
       "from renewable sources."),
      ("Staff turnover fell to its lowest level in four years, which management attributed to a new training "
       "programme and more flexible shifts.",
       "Employee turnover also fell, helped by a training scheme introduced last year."),
      optional=True),
    S(("{ceo_s} closed the update by thanking employees for a disciplined quarter.",
       "In closing, {ceo_s} thanked staff and said the company would stay focused on its customers rather than on "
       "short-term targets."),
      ("The next results are due in {month}.", "The company will report its next quarterly results in {month}."),
      optional=True),
))
