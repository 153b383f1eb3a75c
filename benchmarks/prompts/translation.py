"""translation: translate one paragraph (expected output 100-300 tokens).

Mostly Korean<->English in both directions, plus English into Japanese, Chinese, French, German and
Spanish, Korean into Japanese and Chinese, and French, German and Spanish into English. English
sources are single sections of the document genres, Korean sources come from korean_sources, and
the few French, German and Spanish sources are written here. Every prompt is the instruction, a
blank line, then the source paragraph."""
from __future__ import annotations

import random

from benchmarks.prompts import korean_sources
from benchmarks.prompts.documents import render_paragraph
from benchmarks.prompts.genres import GENRES
from benchmarks.prompts.text import apportion, clamp_round

LO, HI = 100, 300
# language code -> (English name, Korean name)
LANGUAGES = {"en": ("English", "영어"), "ko": ("Korean", "한국어"), "ja": ("Japanese", "일본어"),
             "zh": ("Simplified Chinese", "중국어(간체)"), "fr": ("French", "프랑스어"), "de": ("German", "독일어"),
             "es": ("Spanish", "스페인어")}
# (source, target, weight); the weights are the counts for the 70-prompt set.
PAIRS = (("en", "ko", 26), ("ko", "en", 24), ("en", "ja", 3), ("en", "zh", 2), ("en", "fr", 2), ("en", "de", 2),
         ("en", "es", 2), ("ko", "ja", 2), ("ko", "zh", 1), ("fr", "en", 2), ("de", "en", 2), ("es", "en", 2))


def _tokens_per_word(src: str, tgt: str) -> float:
    """A rough output budget per source word (a Korean word carries a noun and its particles, and
    Korean, Japanese and Chinese cost more tokens per meaning than European languages)."""
    if src == "ko":
        return 3.0
    if tgt in ("ko", "ja", "zh"):
        return 3.3
    return 2.0


_FOREIGN = {
    "fr": ("La mairie a annoncé hier que la piscine municipale fermera ses portes pendant trois mois pour des "
           "travaux de rénovation. Le bassin principal sera entièrement refait, et les vestiaires seront rendus "
           "accessibles aux personnes à mobilité réduite. Pendant la fermeture, les clubs de natation pourront "
           "utiliser la piscine de la commune voisine, grâce à un accord conclu entre les deux villes. La "
           "réouverture est prévue pour le début de l'automne, si le chantier respecte le calendrier.",
           "Chère Madame, je vous remercie pour votre message et pour l'intérêt que vous portez à notre atelier de "
           "céramique. Les cours pour débutants ont lieu le mardi et le jeudi soir, de dix-huit heures à vingt "
           "heures. Tout le matériel est fourni, mais nous vous conseillons d'apporter un tablier et des vêtements "
           "que vous ne craignez pas de salir. Il reste deux places dans le groupe qui commence le mois prochain. "
           "N'hésitez pas à m'appeler si vous avez d'autres questions."),
    "de": ("Ab dem nächsten Monat ändert sich der Fahrplan der Buslinie 12. Die Busse fahren werktags künftig alle "
           "zehn Minuten statt alle fünfzehn Minuten, am Wochenende bleibt der Takt unverändert. Außerdem wird in "
           "der Nähe des Krankenhauses eine neue Haltestelle eingerichtet. Die Verkehrsbetriebe bitten die "
           "Fahrgäste, sich vor Fahrtantritt in der App über die neuen Abfahrtszeiten zu informieren.",
           "Vielen Dank für Ihre Bestellung. Leider ist einer der bestellten Artikel, die Kaffeemühle in Grau, "
           "derzeit nicht vorrätig. Wir erwarten eine neue Lieferung in etwa zwei Wochen. Sie können entweder auf "
           "die Lieferung warten oder den Artikel stornieren; in diesem Fall erstatten wir Ihnen den Betrag "
           "innerhalb von fünf Werktagen. Bitte teilen Sie uns kurz mit, welche Möglichkeit Ihnen lieber ist."),
    "es": ("El próximo sábado se celebrará en la plaza mayor el tradicional mercado de productores locales. Más de "
           "cuarenta puestos ofrecerán frutas, verduras, quesos, pan artesanal y miel de la comarca. Por la mañana "
           "habrá talleres de cocina para niños, y por la tarde un grupo de música folclórica animará la jornada. "
           "El ayuntamiento recomienda acudir a pie o en bicicleta, ya que las calles del centro estarán cerradas "
           "al tráfico.",
           "Hola, Lucía: te escribo para contarte que por fin hemos encontrado piso en Valencia. Es pequeño, pero "
           "tiene mucha luz y está a diez minutos andando de la playa. La mudanza será a finales de mes, así que "
           "estas semanas estamos rodeados de cajas. Cuando estemos instalados, tienes que venir a visitarnos; te "
           "podemos preparar el sofá cama. Un abrazo muy fuerte."),
}
_EN_FRAMES = ("Translate the following text into {tgt}.", "Please translate this {src} text into natural {tgt}.",
              "Translate into {tgt}. Keep names, numbers and formatting unchanged.",
              "Translate the passage below from {src} to {tgt}. Output only the translation.")
_KO_FRAMES = ("다음 글을 {tgt_ko}로 번역해 주세요.", "아래 {src_ko} 문단을 자연스러운 {tgt_ko}로 옮겨 주세요. 고유명사와 숫자는 "
              "그대로 두세요.", "다음 글을 {tgt_ko}로 번역하고, 번역문만 출력해 주세요.")
_SYSTEMS = ("You are a professional translator. Preserve meaning, tone and register.",
            "당신은 전문 번역가입니다. 원문의 뜻과 어조를 살려 번역하세요.")


class _Sources:
    """Deals source paragraphs without repeats: each English (genre, section), Korean template and
    foreign paragraph is used at most once per run."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.english = [(g, i) for g in GENRES for i in range(len(g.sections))]
        self.korean = list(range(len(korean_sources.TEMPLATES)))
        self.foreign = {k: list(v) for k, v in _FOREIGN.items()}
        for pool in (self.english, self.korean, *self.foreign.values()):
            rng.shuffle(pool)

    def take(self, lang: str) -> str:
        try:
            if lang == "en":
                genre, index = self.english.pop()
                return render_paragraph(self.rng, genre, index)
            if lang == "ko":
                return korean_sources.render(self.rng, self.korean.pop())[1]
            return self.foreign[lang].pop()
        except IndexError:
            raise ValueError(f"translation: ran out of distinct {lang!r} source paragraphs") from None


def _instruction(rng: random.Random, src: str, tgt: str) -> str:
    names = dict(src=LANGUAGES[src][0], tgt=LANGUAGES[tgt][0], src_ko=LANGUAGES[src][1], tgt_ko=LANGUAGES[tgt][1])
    korean_frame = "ko" in (src, tgt) and rng.random() < 0.5
    return rng.choice(_KO_FRAMES if korean_frame else _EN_FRAMES).format_map(names)


def generate(rng: random.Random, n: int) -> list[dict]:
    sources = _Sources(rng)
    pairs = [(s, t) for (s, t, _), k in zip(PAIRS, apportion([w for *_, w in PAIRS], n)) for _ in range(k)]
    rng.shuffle(pairs)
    out = []
    for src, tgt in pairs:
        text = sources.take(src)
        messages = [{"role": "user", "content": f"{_instruction(rng, src, tgt)}\n\n{text}"}]
        if rng.random() < 0.2:
            messages.insert(0, {"role": "system", "content": rng.choice(_SYSTEMS)})
        budget = len(text.split()) * _tokens_per_word(src, tgt)
        out.append({"messages": messages, "max_tokens": clamp_round(budget, LO, HI)})
    return out
