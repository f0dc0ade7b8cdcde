/* flitew: flite synthesis with word times, for the training corpus (realtime/train/flite.py).
 *
 * Reads lines "voice<TAB>duration_stretch<TAB>f0_mean<TAB>text" on stdin (f0_mean <= 0 keeps the
 * voice's own); for each writes one header line
 *     "U <num_samples>[<TAB>word start end]...\n"
 * followed by num_samples 16-bit little-endian samples at 16 kHz. A line that cannot be
 * synthesised gives "E <message>\n". Word start = end of the segment before the word's first
 * segment; word end = end of its last segment (speech_data.md §1).
 *
 * Build: gcc -O2 flitew.c -o flitew -I/usr/include/flite -lflite_cmu_us_slt -lflite_cmu_us_rms
 *        -lflite_cmu_us_awb -lflite_cmu_us_kal16 -lflite_usenglish -lflite_cmulex -lflite -lm
 */
#include <flite.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

cst_voice *register_cmu_us_slt(const char *voxdir);
cst_voice *register_cmu_us_rms(const char *voxdir);
cst_voice *register_cmu_us_awb(const char *voxdir);
cst_voice *register_cmu_us_kal16(const char *voxdir);

typedef struct {
    const char *name;
    cst_voice *voice;
    float f0_default;
} voice_slot;

static voice_slot slots[4];

static cst_voice *pick(const char *name, float *f0_default) {
    for (int i = 0; i < 4; i++) {
        if (strcmp(slots[i].name, name) == 0) {
            *f0_default = slots[i].f0_default;
            return slots[i].voice;
        }
    }
    return NULL;
}

int main(void) {
    flite_init();
    slots[0] = (voice_slot){"slt", register_cmu_us_slt(NULL), 0};
    slots[1] = (voice_slot){"rms", register_cmu_us_rms(NULL), 0};
    slots[2] = (voice_slot){"awb", register_cmu_us_awb(NULL), 0};
    slots[3] = (voice_slot){"kal16", register_cmu_us_kal16(NULL), 0};
    for (int i = 0; i < 4; i++)
        slots[i].f0_default = get_param_float(slots[i].voice->features, "int_f0_target_mean", 100.0);

    static char line[1 << 16];
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\r\n")] = 0;
        char *voice = strtok(line, "\t");
        char *stretch = strtok(NULL, "\t");
        char *f0 = strtok(NULL, "\t");
        char *text = strtok(NULL, "\t");
        float f0_default;
        cst_voice *v = voice ? pick(voice, &f0_default) : NULL;
        if (!v || !stretch || !f0 || !text) {
            printf("E bad request or unknown voice\n");
            fflush(stdout);
            continue;
        }
        float f0v = (float)atof(f0);
        feat_set_float(v->features, "duration_stretch", (float)atof(stretch));
        feat_set_float(v->features, "int_f0_target_mean", f0v > 0 ? f0v : f0_default);
        cst_utterance *u = flite_synth_text(text, v);
        cst_wave *w = u ? utt_wave(u) : NULL;
        if (!w) {
            printf("E synthesis failed\n");
            fflush(stdout);
            if (u) delete_utterance(u);
            continue;
        }
        cst_wave_resample(w, 16000);
        printf("U %d", cst_wave_num_samples(w));
        for (cst_item *it = relation_head(utt_relation(u, "Word")); it; it = item_next(it)) {
            printf("\t%s %.4f %.4f", item_feat_string(it, "name"),
                   ffeature_float(it, "R:SylStructure.daughter1.daughter1.R:Segment.p.end"),
                   ffeature_float(it, "R:SylStructure.daughtern.daughtern.R:Segment.end"));
        }
        printf("\n");
        fwrite(cst_wave_samples(w), sizeof(short), cst_wave_num_samples(w), stdout);
        fflush(stdout);
        delete_utterance(u);
    }
    return 0;
}
