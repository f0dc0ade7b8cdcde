/* pcaudio_stub: a libpcaudio.so.0 without audio devices, for libespeak-ng on a machine without
 * sound libraries (the training machine). espeak-ng only opens an audio device for
 * AUDIO_OUTPUT_PLAYBACK; the corpus synthesis uses AUDIO_OUTPUT_SYNCHRONOUS, so these are never
 * called there, but the dynamic loader needs the symbols. Every call reports failure.
 *
 * Build: gcc -O2 -shared -fPIC -Wl,-soname,libpcaudio.so.0 pcaudio_stub.c -o libpcaudio.so.0
 */
#include <stddef.h>
#include <stdint.h>

struct audio_object;

struct audio_object *create_audio_device_object(const char *device, const char *app, const char *desc) {
    (void)device; (void)app; (void)desc;
    return NULL;
}
int audio_object_open(struct audio_object *o, int format, uint32_t rate, uint8_t channels) {
    (void)o; (void)format; (void)rate; (void)channels;
    return -1;
}
void audio_object_close(struct audio_object *o) { (void)o; }
void audio_object_destroy(struct audio_object *o) { (void)o; }
int audio_object_write(struct audio_object *o, const void *data, size_t bytes) {
    (void)o; (void)data; (void)bytes;
    return -1;
}
int audio_object_drain(struct audio_object *o) { (void)o; return -1; }
int audio_object_flush(struct audio_object *o) { (void)o; return -1; }
const char *audio_object_strerror(struct audio_object *o, int error) {
    (void)o; (void)error;
    return "no audio device (pcaudio stub)";
}
